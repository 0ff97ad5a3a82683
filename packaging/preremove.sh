#!/bin/sh
# Stop the agent before its binary goes (it stores its last interval on stop).
set -e
if [ -d /run/systemd/system ] && [ "$1" = remove ]; then
  systemctl disable --now deptrace.service || true
fi
exit 0
