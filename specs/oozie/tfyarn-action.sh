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
BACKEND=${TFYARN_BACKEND:---yarn}
# Delegation tokens: Oozie's launcher sets HADOOP_TOKEN_FILE_LOCATION; tfyarn/skein and hdfs-native use it as is.
echo "tfyarn-action: spec=$spec tokens=${HADOOP_TOKEN_FILE_LOCATION:-none}" >&2
# A retried action (Oozie retry, or a rerun of the workflow) must not start a second job while the first one still
# runs: TFYARN_ADOPT_TAG (e.g. oozie-wf=${wf:id()}, also in the spec's tags) finds it, and this try follows it.
app_id=""
if [ -n "${TFYARN_ADOPT_TAG:-}" ]; then
  app_id=$("$TFYARN" -q list "$BACKEND" --running --tag "$TFYARN_ADOPT_TAG" --output ids | head -n 1) || exit $?
  [ -n "$app_id" ] && echo "tfyarn-action: adopting $app_id, still running from an earlier try" >&2
fi
if [ -z "$app_id" ]; then
  app_id=$("$TFYARN" -q submit "$spec" "$BACKEND" "$@") || exit $?
fi
echo "app_id=$app_id"
trap 'echo "tfyarn-action: killed, killing $app_id" >&2; "$TFYARN" kill "$app_id" >&2; exit 3' TERM INT
"$TFYARN" wait "$app_id" >&2 &
wait $!
rc=$?
echo "exit_code=$rc"
exit "$rc"
