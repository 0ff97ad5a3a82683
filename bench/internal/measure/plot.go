package measure

import (
	"cmp"
	"fmt"
	"path/filepath"
	"slices"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// WritePlots draws the figures of the published evaluation from rows:
// CPU against rate per method for each workload (total and tracer process
// only), kernel time per round trip, recall, and CPU against the number of
// peers. Kernel time is net of bpf_stats' own clock reads (Row.NetMeasured;
// as measured where the floor was not). It returns the files written.
func WritePlots(dir string, rows []Row) ([]string, error) {
	var files []string
	var workloads []string
	for _, r := range rows {
		if r.Sweep == "rate" && !slices.Contains(workloads, r.Workload) {
			workloads = append(workloads, r.Workload)
		}
	}
	type figure struct {
		file, title, xlabel, ylabel string
		sweep, workload             string
		x                           func(Row) float64
		y                           func(Row) float64
		skip                        func(Row) bool
	}
	rate := func(r Row) float64 { return r.TargetRate }
	var figs []figure
	for _, w := range workloads {
		figs = append(figs,
			figure{"cpu-total-" + w + ".png", "Tracing CPU (process + kernel programs, net of bpf_stats), " + w, "target rate (round trips/s)", "% of one core",
				"rate", w, rate, Row.NetTotalCPU, nil},
			figure{"cpu-process-" + w + ".png", "Tracer process CPU, " + w, "target rate (round trips/s)", "% of one core",
				"rate", w, rate, func(r Row) float64 { return r.TracerCPU }, nil},
			figure{"kernel-ns-" + w + ".png", "Kernel program time per round trip (net of bpf_stats), " + w, "target rate (round trips/s)", "ns per round trip",
				"rate", w, rate, Row.NetKernelNsPerRT, func(r Row) bool { return r.Method == Polling }},
			figure{"recall-" + w + ".png", "Dependency recall, " + w, "target rate (round trips/s)", "recall",
				"rate", w, rate, func(r Row) float64 { return r.Recall }, nil},
		)
	}
	peersX := func(r Row) float64 { return float64(r.Peers) }
	figs = append(figs,
		figure{"peers-cpu.png", "Tracing CPU (net of bpf_stats) vs emulated client hosts", "client hosts", "% of one core", "peers", "", peersX, Row.NetTotalCPU, nil},
		figure{"peers-recall.png", "Recall vs emulated client hosts", "client hosts", "recall", "peers", "", peersX, func(r Row) float64 { return r.Recall }, nil},
	)
	for _, f := range figs {
		p := plot.New()
		p.Title.Text = f.title
		p.X.Label.Text = f.xlabel
		p.Y.Label.Text = f.ylabel
		p.Legend.Top = true
		p.Y.Min = 0
		var args []any
		for _, m := range Methods {
			var pts plotter.XYs
			for _, r := range rows {
				if r.Sweep != f.sweep || r.Method != m || (f.workload != "" && r.Workload != f.workload) || (f.skip != nil && f.skip(r)) {
					continue
				}
				pts = append(pts, plotter.XY{X: f.x(r), Y: f.y(r)})
			}
			if len(pts) > 0 {
				slices.SortFunc(pts, func(a, b plotter.XY) int { return cmp.Compare(a.X, b.X) })
				args = append(args, m, pts)
			}
		}
		if len(args) == 0 {
			continue
		}
		if err := plotutil.AddLinePoints(p, args...); err != nil {
			return files, fmt.Errorf("plot %s: %w", f.file, err)
		}
		path := filepath.Join(dir, f.file)
		if err := p.Save(7*vg.Inch, 4.5*vg.Inch, path); err != nil {
			return files, fmt.Errorf("save %s: %w", path, err)
		}
		files = append(files, path)
	}
	return files, nil
}
