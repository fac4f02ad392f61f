#!/usr/bin/env bash
# Start the pseudo-distributed Hadoop 3.3 cluster, wait until HDFS and YARN are usable (bounded), and write a
# HADOOP_CONF_DIR for the gateway (this machine) plus a Hadoop client copied out of the image (skein's Java driver
# needs `yarn classpath`). Prints the exports to use. Usage: scripts/minicluster/start.sh [timeout_s]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
timeout_s="${1:-300}"
out="${TFYARN_MINICLUSTER_DIR:-$here/.state}"
mkdir -p "$out/conf"
# the base interpreter of the venv tfyarn packs (mounted read-only into the NodeManager at the same path)
if [ -z "${TFYARN_BASE_PYTHON:-}" ]; then
  TFYARN_BASE_PYTHON="$(python3 -c 'import sys; print(sys.base_prefix)')"
fi
export TFYARN_BASE_PYTHON
cd "$here"
docker compose up -d

deadline=$(( $(date +%s) + timeout_s ))
wait_for() {   # wait_for "<what>" <command...>: retry until it succeeds or the deadline passes
  local what="$1"; shift
  until "$@" >/dev/null 2>&1; do
    if [ "$(date +%s)" -ge "$deadline" ]; then
      echo "timed out after ${timeout_s}s waiting for $what" >&2
      docker compose logs --tail 50 >&2 || true
      exit 1
    fi
    sleep 2
  done
  echo "ok: $what"
}
wait_for "HDFS to leave safe mode" bash -c \
  "docker compose exec -T namenode hdfs dfsadmin -safemode get | grep -q OFF"
wait_for "a live DataNode" bash -c \
  "docker compose exec -T namenode hdfs dfsadmin -report -live | grep -q 'Live datanodes (1)'"
wait_for "a RUNNING NodeManager in the ResourceManager" bash -c \
  "curl -sf http://localhost:8088/ws/v1/cluster/metrics | grep -q '\"activeNodes\":[1-9]'"

user="${HADOOP_USER_NAME:-$(id -un)}"
docker compose exec -T namenode bash -c "hdfs dfs -mkdir -p /user/$user /tmp/logs && hdfs dfs -chmod 1777 /tmp /tmp/logs \
  && hdfs dfs -chmod 777 /user/$user"

# client config = the config the daemons run with
docker compose exec -T resourcemanager bash -c 'cat $HADOOP_CONF_DIR/core-site.xml' > "$out/conf/core-site.xml"
docker compose exec -T resourcemanager bash -c 'cat $HADOOP_CONF_DIR/hdfs-site.xml' > "$out/conf/hdfs-site.xml"
docker compose exec -T resourcemanager bash -c 'cat $HADOOP_CONF_DIR/yarn-site.xml' > "$out/conf/yarn-site.xml"
docker compose exec -T resourcemanager bash -c 'cat $HADOOP_CONF_DIR/capacity-scheduler.xml' \
  > "$out/conf/capacity-scheduler.xml" || true
if [ ! -x "$out/hadoop/bin/yarn" ]; then
  docker compose cp resourcemanager:/opt/hadoop "$out/hadoop"
fi
cat > "$out/env.sh" <<ENV
export HADOOP_CONF_DIR="$out/conf"
export HADOOP_HOME="$out/hadoop"
export PATH="$out/hadoop/bin:\$PATH"
export HADOOP_USER_NAME="$user"
ENV
echo "cluster ready. Use it with:"
echo "  source $out/env.sh && .venv/bin/pytest -m yarn tests/cluster/yarn"
