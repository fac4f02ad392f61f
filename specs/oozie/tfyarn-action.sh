#!/usr/bin/env bash
# Oozie shell action: submit a tfyarn job to YARN, wait for its end, exit with tfyarn's code.
#   tfyarn-action.sh SPEC [--set key=value ...]
# stdout carries only key=value lines (Oozie <capture-output/>: app_id, state, exit_code for later actions);
# everything else goes to stderr, which Oozie keeps in the launcher's log.
# If Oozie kills the action (the launcher gets SIGTERM), the YARN app is killed too: nothing runs unattended.
# TFYARN_OOZIE_VALIDATE=1 only validates SPEC with the same --set arguments (what the tests run).
set -uo pipefail
TFYARN=${TFYARN:-tfyarn}
spec=${1:?usage: tfyarn-action.sh SPEC [--set key=value ...]}
shift
if [ "${TFYARN_OOZIE_VALIDATE:-0}" = 1 ]; then
  exec "$TFYARN" validate "$spec" "$@"
fi
# Delegation tokens: Oozie's launcher sets HADOOP_TOKEN_FILE_LOCATION; tfyarn/skein and hdfs-native use it as is.
echo "tfyarn-action: spec=$spec tokens=${HADOOP_TOKEN_FILE_LOCATION:-none}" >&2
app_id=$("$TFYARN" -q submit "$spec" --yarn "$@") || exit $?
echo "app_id=$app_id"
trap 'echo "tfyarn-action: killed, killing $app_id" >&2; "$TFYARN" kill "$app_id" >&2; exit 3' TERM INT
"$TFYARN" wait "$app_id" >&2 &
wait $!
rc=$?
echo "exit_code=$rc"
exit "$rc"
