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
# listed NAME BINARY PATTERN prints "@@KM LIST NAME TEST" for each test that
# -test.run=PATTERN selects: a binary stopped by its -test.timeout names
# only the test it was in, parse.awk names the others from this list.
# -test.list matches whole top-level names (-test.run splits at "/": such a
# pattern lists nothing) and lists benchmarks, fuzz targets and examples
# too: only Test names are kept. Its errors are the run's, printed there.
listed() {
  case "$3" in */*) return 0 ;; esac
  "$2" -test.list="${3:-.}" 2>/dev/null | while read -r lt more; do
    case "$lt" in Test*) [ -z "$more" ] && echo "@@KM LIST $1 $lt" ;; esac
  done
}
# test_binary NAME BINARY lists, then runs, the tests testrun selects.
test_binary() {
  pat=$(testrun "$1")
  listed "$1" "$2" "$pat"
  "$2" -test.v -test.count=1 -test.timeout="${TEST_TIMEOUT}s" -test.run="$pat"
}
echo "@@KM INFO memlock-limit $(ulimit -l)"
step doctor deptrace doctor --sample 1s
if [ "$MODE" = full ]; then
  for t in /opt/km/*.test; do
    [ -f "$t" ] || continue
    n=$(basename "$t" .test)
    step "$n" test_binary "$n" "$t"
  done
fi
