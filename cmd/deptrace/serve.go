package main

import (
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/deptrace/deptrace/internal/cli"
	"github.com/deptrace/deptrace/internal/store"
	"github.com/deptrace/deptrace/internal/web"
)

func newServeCmd() *cobra.Command {
	var listen, storeSpec, tokenFile string
	var cacheMB int64
	var health healthFlags
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Serve the service-map page and the JSON API over the store",
		Long: `serve answers HTTP on --listen (default ` + web.DefaultListen + `): the service-map page
at /, and /api/graph, /api/look and /api/diff, which answer what graph --format
json, look and diff print, with the same filters as query parameters
(docs/api.md). It reads the store look, graph and diff read, and keeps the
sums of past hours and days in memory (--cache-mb) so that long ranges
answer fast; writes into those hours, late ones included, drop what they
touch.

Listening beyond loopback requires --token-file: every request must then carry
"Authorization: Bearer TOKEN" (the page: open it once with ?token=TOKEN,
the token URL-encoded).`,
		Example: `  deptrace serve
  deptrace serve --store postgres://deptrace@db.example/deptrace
  deptrace serve --listen 0.0.0.0:7777 --token-file /etc/deptrace/token`,
		Args: cli.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := web.CheckListen(listen, tokenFile != ""); err != nil {
				return err
			}
			if cacheMB < 0 {
				return fmt.Errorf("invalid --cache-mb %d: allowed %s", cacheMB, cacheSizes)
			}
			if err := health.validate(); err != nil {
				return err
			}
			var token string
			if tokenFile != "" {
				var err error
				if token, err = web.ReadToken(tokenFile); err != nil {
					return err
				}
			}
			if !strings.Contains(storeSpec, "://") {
				if _, err := os.Stat(storeSpec); err != nil {
					return fmt.Errorf("no store at %s: run deptrace agent first, or pass --store", storeSpec)
				}
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), cli.StopSignals()...)
			defer stop()
			st, err := store.Open(ctx, storeSpec)
			if err != nil {
				return err
			}
			defer func() { _ = st.Close() }() // serve only reads
			if cacheMB > 0 {
				st.EnableCache(store.CacheConfig{Bytes: cacheMB << 20})
			}
			ln, err := net.Listen("tcp", listen)
			if err != nil {
				return fmt.Errorf("listen on --listen %s: %w", listen, err)
			}
			log := slog.With("component", "serve")
			log.Info("serving", "url", "http://"+ln.Addr().String()+"/", "store", st.String(), "token", token != "")
			if cacheMB > 0 {
				// Read the last 24 hours into the cache now rather than
				// in the first request (a request meanwhile waits for it).
				go func() {
					t0 := time.Now()
					if _, err := st.Observations(ctx, store.Range{Since: t0.Add(-24 * time.Hour)}); err != nil {
						if ctx.Err() == nil {
							log.Warn("warming the cache", "err", err)
						}
						return
					}
					log.Info("cache warmed with the last 24 hours", "took", time.Since(t0).Round(time.Millisecond))
				}()
			}
			return web.Serve(ctx, ln, web.New(st, web.Options{Token: token, Log: log, Health: health.h, DNSHealth: health.dns}), log)
		},
	}
	cmd.Flags().StringVar(&listen, "listen", web.DefaultListen, "HOST:PORT to answer on; beyond loopback needs --token-file")
	cmd.Flags().StringVar(&storeSpec, "store", store.DefaultPath, "SQLite file path, or postgres://user@host/db")
	cmd.Flags().StringVar(&tokenFile, "token-file", "", "file holding the bearer token every request must carry")
	health.register(cmd)
	cmd.Flags().Int64Var(&cacheMB, "cache-mb", store.DefaultCacheBytes>>20, "memory for the sums of past hours and days kept between queries (exact: late writes drop what they touch); 0: none")
	cli.SetAllowed(cmd.Flags(), "cache-mb", cacheSizes)
	return cmd
}

// cacheSizes is what --cache-mb takes.
const cacheSizes = "0 (no cache) or more"
