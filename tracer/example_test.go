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

// A process that must lose nothing when it is killed pins its kernel side
// and commits each interval only once it is stored: a killed process's
// interval is collected again by the next one, under the same BatchID.
func ExampleInterval_Commit() {
	cfg := tracer.DefaultConfig()
	cfg.PinPath = tracer.DefaultPinPath
	t, err := tracer.New(cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer t.Close()

	applied := map[string]bool{} // a real store records applied ids durably
	store := func(iv tracer.Interval) error {
		if applied[iv.BatchID] {
			return nil // stored before the previous process died
		}
		applied[iv.BatchID] = true
		fmt.Println(iv.BatchID, len(iv.Flows), "flows")
		return nil
	}
	for i := 0; i < 3; i++ {
		time.Sleep(cfg.Interval)
		iv, err := t.Collect()
		if err != nil {
			log.Print(err)
		}
		if err := store(iv); err != nil {
			continue // not committed: the next Collect returns it again
		}
		if err := iv.Commit(); err != nil {
			log.Print(err)
		}
	}
}

// A process that stores intervals on another goroutine (a slow database)
// hands each over and commits it once stored, or abandons it if it cannot
// be: the next drain waits meanwhile, and an abandoned interval stays in
// the pinned kernel side, collected again under the same BatchID.
func ExampleTracer_RunWith() {
	cfg := tracer.DefaultConfig()
	cfg.PinPath = tracer.DefaultPinPath
	t, err := tracer.New(cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer t.Close()

	store := func(iv tracer.Interval) error { return nil } // a real store writes iv durably, applying each BatchID once
	work := make(chan tracer.Interval, 1)
	go func() {
		for iv := range work {
			if err := store(iv); err != nil {
				iv.Abandon()
				continue
			}
			if err := iv.Commit(); err != nil {
				log.Print(err)
			}
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = t.RunWith(ctx, tracer.RunOptions{AsyncCommit: true, DrainFailed: func(err error) { log.Print(err) }},
		func(iv tracer.Interval) error { work <- iv; return nil })
	close(work)
	if err != nil {
		log.Fatal(err)
	}
}
