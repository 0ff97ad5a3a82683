#!/bin/sh
# The store in /var/lib/deptrace is kept on remove; purge deletes it.
set -e
if [ -d /run/systemd/system ]; then
  systemctl daemon-reload || true
fi
if [ "$1" = purge ]; then
  rm -rf /var/lib/deptrace /var/lib/private/deptrace
fi
exit 0
