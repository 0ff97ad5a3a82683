# Run by the guest's /init (busybox sh) with CI=true as root; output goes to
# the results serial port. MODE and TEST_TIMEOUT are set in the lines above
# (written by the host). Each step is framed by @@KM BEGIN/END lines.
step() {
  name=$1; shift
  echo "@@KM BEGIN $name"
  "$@"
  echo "@@KM END $name $?"
}
echo "@@KM INFO memlock-limit $(ulimit -l)"
step doctor deptrace doctor --sample 1s
if [ "$MODE" = full ]; then
  for t in /opt/km/*.test; do
    [ -f "$t" ] || continue
    n=$(basename "$t" .test)
    step "$n" "$t" -test.v -test.count=1 -test.timeout="${TEST_TIMEOUT}s"
  done
fi
