#!/usr/bin/env bash
# Stop the mini cluster and drop its state (HDFS contents, logs).
set -euo pipefail
cd "$(dirname "$0")"
docker compose down -v
