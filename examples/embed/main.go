// Command embed shows the smallest program that embeds deptrace's tracer:
// it prints each dependency seen, once per interval, for --duration.
//
//	sudo go run ./examples/embed -duration 10s
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"time"

	"github.com/deptrace/deptrace/tracer"
)

func main() {
	duration := flag.Duration("duration", 10*time.Second, "how long to trace")
	flag.Parse()

	t, err := tracer.New(tracer.DefaultConfig())
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = t.Close() }() // unloads the kernel side at exit

	ctx, cancel := context.WithTimeout(context.Background(), *duration)
	defer cancel()
	err = t.Run(ctx, func(iv tracer.Interval) error {
		for _, f := range iv.Flows {
			fmt.Printf("%s  %s  %s -> %s  %s/%d  conns=%d failed=%d sent=%d recv=%d\n",
				f.Time.Format(time.TimeOnly), f.Proto, f.ClientAddr(), f.Server(),
				f.Comm, f.PID, f.Connections, f.FailedConnections, f.BytesSent, f.BytesReceived)
		}
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
}
