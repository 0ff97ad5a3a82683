#!/usr/bin/env bash
# Checks parse.awk on fixture results logs, without a VM: the rows and the
# COUNTS line, tests listed (@@KM LIST) but never started, logs without
# LIST lines, lib.sh's km_tier_check on those rows, and guest-steps.sh's
# LIST lines with fake test binaries (under busybox sh when there is one,
# as in the guest). Exits 1 on a mismatch.
# usage: scripts/kernel-matrix/parse-test.sh   (AWK=busybox\ awk: another awk)
set -euo pipefail
km=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
read -r -a awk <<<"${AWK:-awk}"
failed=0

# check NAME COUNTED: parse.awk's output for $tmp/NAME.log against the rows
# on stdin. Runs of spaces are squeezed on both sides: the columns'
# padding is row()'s, not what these cases check.
check() {
  "${awk[@]}" -v abi=x -v counted="$2" -f "$km/parse.awk" "$tmp/$1.log" >"$tmp/$1.rows"
  tr -s ' ' <"$tmp/$1.rows" >"$tmp/$1.got"
  if diff -u - "$tmp/$1.got" >"$tmp/$1.diff"; then
    echo "ok   $1"
  else
    echo "FAIL $1 (- want, + got):"; cat "$tmp/$1.diff"; failed=1
  fi
}

# A normal step: every listed test ran (a failure, a skip, subtests).
cat >"$tmp/normal.log" <<'EOF'
@@KM READY 6.1.0-56-cloud-amd64
@@KM INFO memlock-limit unlimited
@@KM BEGIN doctor
deptrace doctor: every hook active
@@KM END doctor 0
@@KM BEGIN internal_bundler
@@KM LIST internal_bundler TestLoads
@@KM LIST internal_bundler TestCounts
@@KM LIST internal_bundler TestOld
=== RUN   TestLoads
--- PASS: TestLoads (1.20s)
=== RUN   TestCounts
=== RUN   TestCounts/tcp
    counts_priv_test.go:42: got 3 connections, want 4
=== RUN   TestCounts/udp
--- FAIL: TestCounts (2.00s)
    --- FAIL: TestCounts/tcp (1.00s)
    --- PASS: TestCounts/udp (1.00s)
=== RUN   TestOld
    old_priv_test.go:10: needs 6.8
--- SKIP: TestOld (0.00s)
FAIL
@@KM END internal_bundler 1
@@KM DONE
EOF
check normal 1 <<'EOF'
KERNEL x doctor - PASS
KERNEL x internal_bundler TestLoads PASS
KERNEL x internal_bundler TestCounts FAIL (counts_priv_test.go:42: got 3 connections, want 4)
KERNEL x internal_bundler TestOld SKIP (old_priv_test.go:10: needs 6.8)
COUNTS 2 1 1 0
EOF

# Binaries stopped by their -test.timeout: tracer in its second test, two
# listed tests after it never started; internal_bundler after a failed
# test (no "(binary)" row then); the next step's list stands alone.
cat >"$tmp/timeout.log" <<'EOF'
@@KM READY 7.3.0-1-cloud-amd64
@@KM BEGIN doctor
@@KM END doctor 0
@@KM BEGIN tracer
@@KM LIST tracer TestFirst
@@KM LIST tracer TestHangs
@@KM LIST tracer TestAfterOne
@@KM LIST tracer TestAfterTwo
=== RUN   TestFirst
--- PASS: TestFirst (3.10s)
=== RUN   TestHangs
panic: test timed out after 2700s
	running tests:
		TestHangs (44m57s)

goroutine 18 [running]:
testing.(*M).startAlarm.func1()
	/usr/local/go/src/testing/testing.go:2484 +0x345
created by time.goFunc
	/usr/local/go/src/time/sleep.go:215 +0x2d
@@KM END tracer 2
@@KM BEGIN internal_bundler
@@KM LIST internal_bundler TestA
@@KM LIST internal_bundler TestB
@@KM LIST internal_bundler TestC
=== RUN   TestA
    a_priv_test.go:7: boom
--- FAIL: TestA (0.50s)
=== RUN   TestB
panic: test timed out after 2700s
@@KM END internal_bundler 2
@@KM BEGIN bench_internal_measure
@@KM LIST bench_internal_measure TestM
=== RUN   TestM
--- PASS: TestM (0.01s)
PASS
@@KM END bench_internal_measure 0
@@KM DONE
EOF
check timeout 1 <<'EOF'
KERNEL x doctor - PASS
KERNEL x tracer TestFirst PASS
KERNEL x tracer TestHangs FAIL (started, never finished)
KERNEL x tracer (binary) FAIL (exit 2 without a failed test: panic: test timed out after 2700s)
KERNEL x tracer TestAfterOne FAIL (never started: the binary stopped before it (see this step's other rows))
KERNEL x tracer TestAfterTwo FAIL (never started: the binary stopped before it (see this step's other rows))
KERNEL x internal_bundler TestA FAIL (a_priv_test.go:7: boom)
KERNEL x internal_bundler TestB FAIL (started, never finished)
KERNEL x internal_bundler TestC FAIL (never started: the binary stopped before it (see this step's other rows))
KERNEL x bench_internal_measure TestM PASS
COUNTS 3 7 0 0
EOF

# The same on a report row (counted=0): the failures are reported, not counted.
cp "$tmp/timeout.log" "$tmp/timeout-report.log"
check timeout-report 0 <<'EOF'
KERNEL x doctor - PASS [informational]
KERNEL x tracer TestFirst PASS [informational]
KERNEL x tracer TestHangs FAIL (started, never finished) [informational]
KERNEL x tracer (binary) FAIL (exit 2 without a failed test: panic: test timed out after 2700s) [informational]
KERNEL x tracer TestAfterOne FAIL (never started: the binary stopped before it (see this step's other rows)) [informational]
KERNEL x tracer TestAfterTwo FAIL (never started: the binary stopped before it (see this step's other rows)) [informational]
KERNEL x internal_bundler TestA FAIL (a_priv_test.go:7: boom) [informational]
KERNEL x internal_bundler TestB FAIL (started, never finished) [informational]
KERNEL x internal_bundler TestC FAIL (never started: the binary stopped before it (see this step's other rows)) [informational]
KERNEL x bench_internal_measure TestM PASS [informational]
COUNTS 3 0 0 7
EOF

# The guest stopped mid-step (its time limit): no END line.
cat >"$tmp/stopped.log" <<'EOF'
@@KM READY 6.12.57-cloud-amd64
@@KM BEGIN doctor
@@KM END doctor 0
@@KM BEGIN tracer
@@KM LIST tracer TestFirst
@@KM LIST tracer TestCut
@@KM LIST tracer TestNever
=== RUN   TestFirst
--- PASS: TestFirst (1.00s)
=== RUN   TestCut
EOF
check stopped 1 <<'EOF'
KERNEL x doctor - PASS
KERNEL x tracer TestFirst PASS
KERNEL x tracer TestCut FAIL (started, never finished)
KERNEL x tracer - FAIL (the guest stopped during this step (time limit or crash): see console.log)
KERNEL x tracer TestNever FAIL (never started: the guest stopped before it (see this step's other rows))
COUNTS 2 3 0 0
EOF

# A log from before @@KM LIST (the timeout case without it): rows as before.
grep -v '^@@KM LIST ' "$tmp/timeout.log" >"$tmp/old.log"
check old 1 <<'EOF'
KERNEL x doctor - PASS
KERNEL x tracer TestFirst PASS
KERNEL x tracer TestHangs FAIL (started, never finished)
KERNEL x tracer (binary) FAIL (exit 2 without a failed test: panic: test timed out after 2700s)
KERNEL x internal_bundler TestA FAIL (a_priv_test.go:7: boom)
KERNEL x internal_bundler TestB FAIL (started, never finished)
KERNEL x bench_internal_measure TestM PASS
COUNTS 3 4 0 0
EOF

# CRLF (arm64's serial port), a duplicate LIST line, one cut by a kernel
# message, one of another step, and a listed test a binary that exited 0
# never ran.
printf '%s\r\n' '@@KM READY 6.1.0-56-cloud-arm64' '@@KM BEGIN tracer' \
  '@@KM LIST tracer TestOne' '@@KM LIST tracer TestOne' \
  '@@KM LIST tracer TestTw[   12.345312] virtio_net virtio0: eth0: link up' \
  '@@KM LIST other TestZ' '@@KM LIST tracer TestSkipped' '@@KM LIST tracer TestLeftOut' \
  '=== RUN   TestOne' '--- PASS: TestOne (0.10s)' '=== RUN   TestSkipped' '--- SKIP: TestSkipped (0.00s)' \
  'PASS' '@@KM END tracer 0' '@@KM DONE' >"$tmp/edge.log"
check edge 1 <<'EOF'
KERNEL x tracer TestOne PASS
KERNEL x tracer TestSkipped SKIP
KERNEL x tracer TestLeftOut FAIL (never started: the binary exited 0 without running it)
COUNTS 1 1 1 0
EOF

# km_tier_check (lib.sh) adds no row for a tier test parse.awk already
# failed as never started, and one for a tier test that was never listed.
(
  # shellcheck source=lib.sh
  source "$km/lib.sh"
  tier_tests=("tracer TestFirst" "tracer TestAfterOne" "internal_bundler TestC" "tracer TestEveryAttachedProgramRan")
  cp "$tmp/timeout.rows" "$tmp/tier.rows"
  km_tier_check x "$tmp/tier.rows"
  added=$(diff "$tmp/timeout.rows" "$tmp/tier.rows" | sed -n 's/^> //p' | tr -s ' ')
  want='KERNEL x tracer TestEveryAttachedProgramRan FAIL (in scripts/kernel-matrix/tier but never ran)'
  if [ "$KM_TIER_MISSED" = 1 ] && [ "$added" = "$want" ]; then
    echo "ok   km_tier_check"
  else
    echo "FAIL km_tier_check: KM_TIER_MISSED=$KM_TIER_MISSED, added:"; echo "$added"; exit 1
  fi
) || failed=1

# guest-steps.sh with fake test binaries (shell scripts with the test
# binary's -test.list and -test.run): each lists TestA TestB TestC,
# BenchmarkA and ExampleA, and times out in TestB. full runs everything,
# tier a pattern without TestB, slash a subtest pattern (not listed).
mkdir -p "$tmp/km" "$tmp/path"
cat >"$tmp/fake" <<'EOF'
#!/bin/sh
names="TestA TestB TestC BenchmarkA ExampleA"
case "$1" in -test.list=*)
  for n in $names; do echo "$n" | grep -Eq -- "${1#-test.list=}" && echo "$n"; done
  exit 0 ;;
esac
for a; do case "$a" in -test.run=*) pat=${a#-test.run=} ;; esac; done
pat=${pat%%/*}
for n in TestA TestB TestC; do
  echo "$n" | grep -Eq -- "$pat" || continue
  echo "=== RUN   $n"
  [ "$n" = TestB ] && { echo "panic: test timed out after 1s" >&2; exit 2; }
  echo "--- PASS: $n (0.00s)"
done
echo PASS
EOF
chmod +x "$tmp/fake"
for b in full tier slash; do cp "$tmp/fake" "$tmp/km/$b.test"; done
printf '#!/bin/sh\necho "deptrace doctor: ok"\n' >"$tmp/path/deptrace"
chmod +x "$tmp/path/deptrace"
{
  # As km_guest_script (lib.sh) writes it.
  echo "MODE=full"
  echo "TEST_TIMEOUT=1"
  echo 'testrun() { case "$1" in'
  echo "  tier) echo '^(TestA|TestC)\$' ;;"
  echo "  slash) echo 'TestA/sub' ;;"
  echo '  *) echo "" ;; esac; }'
  sed "s#/opt/km/#$tmp/km/#" "$km/guest-steps.sh"
} >"$tmp/guest.sh"
gsh=(sh); if command -v busybox >/dev/null; then gsh=(busybox sh); fi
{ echo "@@KM READY x"; PATH="$tmp/path:$PATH" "${gsh[@]}" "$tmp/guest.sh" 2>&1; echo "@@KM DONE"; } >"$tmp/guest.log"
check guest 1 <<'EOF'
KERNEL x doctor - PASS
KERNEL x full TestA PASS
KERNEL x full TestB FAIL (started, never finished)
KERNEL x full (binary) FAIL (exit 2 without a failed test: panic: test timed out after 1s)
KERNEL x full TestC FAIL (never started: the binary stopped before it (see this step's other rows))
KERNEL x slash TestA PASS
KERNEL x tier TestA PASS
KERNEL x tier TestC PASS
COUNTS 5 3 0 0
EOF
grep -q '^@@KM LIST full TestC$' "$tmp/guest.log" && ! grep -Eq '^@@KM LIST [^ ]+ (Benchmark|Example)|^@@KM LIST (slash|tier [^ ]*B)' "$tmp/guest.log" ||
  { echo "FAIL guest: unexpected LIST lines:"; grep '^@@KM LIST' "$tmp/guest.log"; failed=1; }

if [ "$failed" -ne 0 ]; then echo "parse-test: failures above" >&2; exit 1; fi
echo "parse-test: all cases passed"
