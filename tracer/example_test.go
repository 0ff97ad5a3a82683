package tracer_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/deptrace/deptrace/tracer"
)

// Embed the tracer: print every dependency seen for ten seconds. Needs
// root (CAP_BPF, CAP_PERFMON, CAP_NET_ADMIN, CAP_SYS_ADMIN); examples/embed
// is the same program ready to `go run`.
func Example() {
	cfg := tracer.DefaultConfig()
	cfg.Interval = 2 * time.Second
	t, err := tracer.New(cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer t.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = t.Run(ctx, func(iv tracer.Interval) error {
		for _, f := range iv.Flows {
			fmt.Printf("%s %s %s -> %s (%s/%d) %d connections\n",
				f.Proto, f.Direction, f.ClientAddr(), f.ServerAddr(), f.Comm, f.PID, f.Connections)
		}
		if n := iv.Lost.Total(); n > 0 {
			log.Printf("%d events lost", n)
		}
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
}
