# Run by the guest's /init (busybox sh) with CI=true as root; output goes to
# the results serial port. MODE, TEST_TIMEOUT and testrun (the -test.run
# pattern of a test binary, empty for all) are set in the lines above
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
    step "$n" "$t" -test.v -test.count=1 -test.timeout="${TEST_TIMEOUT}s" -test.run="$(testrun "$n")"
  done
fi
