# Turns a guest's results.log into one line per step and test:
#   KERNEL <abi>  <step>  <test>  PASS|FAIL|SKIP  (reason)
# Variables: abi, counted (1: failures count; 0: informational row).
# The last line is "COUNTS <pass> <fail> <skip> <reported>": fail counts
# failures of counted rows, reported those of informational rows.
function row(step, test, res, why) {
  line = sprintf("KERNEL %-28s %-18s %-52s %s", abi, step, test, res)
  if (why != "") line = line "  (" why ")"
  if (!counted) line = line "  [informational]"
  print line
  if (res == "PASS") np++; else if (res == "SKIP") ns++; else if (counted) nf++; else nr++
}
# unstarted(why) fails each test the step listed (@@KM LIST, guest-steps.sh)
# that never started: a binary stopped by its -test.timeout names only the
# test it was in.
function unstarted(why,   i, t) {
  for (i = 1; i <= nlist; i++) { t = listorder[i]; if (!(t in started) && !(t in done)) row(step, t, "FAIL", why) }
}
function top(name) { sub(/\/.*/, "", name); return name }
function trim(s) { sub(/^[ \t]+/, "", s); sub(/[ \t\r]+$/, "", s); return s }
BEGIN { np = nf = ns = nr = 0; ready = 0; step = "" }
{ sub(/\r$/, "") }
/^@@KM READY/ { ready = 1; next }
/^@@KM MODULE-FAILED/ { row("boot", "insmod " $3, "FAIL", "module did not load"); next }
/^@@KM BEGIN / { step = $3; delete started; delete first; delete last; delete done; delete listed; nlist = 0; nres = 0; next }
/^@@KM LIST / {
  # NF: a kernel message cut into the line (arm64's shared port) lists nothing.
  if (step != "" && $3 == step && NF == 4 && !($4 in listed)) { listed[$4] = 1; listorder[++nlist] = $4 }
  next
}
/^@@KM END / {
  rc = $4
  if (step == "doctor") {
    row("doctor", "-", rc == 0 ? "PASS" : "FAIL", rc == 0 ? "" : "exit " rc ": " doctorwhy)
  } else {
    for (t in started) if (!(t in done)) row(step, t, "FAIL", "started, never finished")
    if (rc != 0 && nfail == 0) row(step, "(binary)", "FAIL", "exit " rc " without a failed test: " (panic != "" ? panic : "see results.log"))
    unstarted(rc != 0 ? "never started: the binary stopped before it (see this step's other rows)" : "never started: the binary exited 0 without running it")
  }
  step = ""; doctorwhy = ""; nfail = 0; panic = ""; nlist = 0; next
}
step == "" { next }
step == "doctor" {
  if ($0 ~ /cannot load|MISSING|^Error:/ && doctorwhy == "") doctorwhy = trim($0)
  next
}
/^=== (RUN|CONT|NAME|PAUSE) / { cur = $3; if ($2 == "RUN" && cur !~ /\//) started[cur] = 1; next }
/^panic: / && panic == "" { panic = $0; next }
/^ *--- (PASS|FAIL|SKIP): / {
  res = $2; sub(/:$/, "", res); name = $3
  if (name ~ /\//) next                      # subtests: their parent reports
  done[name] = 1
  why = ""
  if (res == "FAIL") { why = first[name]; nfail++ }
  if (res == "SKIP") why = last[name]
  row(step, name, res, why)
  next
}
/^[ \t]+[^ \t]+\.go:[0-9]+: / {
  t = top(cur); msg = trim($0)
  if (length(msg) > 160) msg = substr(msg, 1, 157) "..."
  if (!(t in first)) first[t] = msg
  last[t] = msg
  next
}
END {
  if (!ready) row("boot", "-", "FAIL", "the guest never reached /init: see console.log")
  else if (step != "") {
    for (t in started) if (!(t in done)) row(step, t, "FAIL", "started, never finished")
    row(step, "-", "FAIL", "the guest stopped during this step (time limit or crash): see console.log")
    unstarted("never started: the guest stopped before it (see this step's other rows)")
  }
  print "COUNTS " np " " nf " " ns " " nr
}
