package realtest

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/deptrace/deptrace/internal/testnet"
)

// WriteNginxConf writes dir/nginx.conf and returns its path: no
// daemonizing, one master and one worker, running as root (the worker
// must reach sockets in the test's private temporary directories), no
// access log, and every path inside dir. servers are the http-level
// server blocks and directives, lines of their own; "{dir}" in them
// stands for dir.
func WriteNginxConf(t testing.TB, dir, servers string) string {
	t.Helper()
	conf := fmt.Sprintf(`daemon off;
master_process on;
worker_processes 1;
user root;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log info;
events { worker_connections 256; }
http {
	access_log off;
	client_body_temp_path %[1]s/body;
	proxy_temp_path %[1]s/proxy;
	fastcgi_temp_path %[1]s/fastcgi;
	uwsgi_temp_path %[1]s/uwsgi;
	scgi_temp_path %[1]s/scgi;
%[2]s
}
`, dir, strings.ReplaceAll(servers, "{dir}", dir))
	path := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// StartNginx runs nginx with the configuration WriteNginxConf makes of
// servers, inside host h, in a new temporary directory dir (its output in
// dir/nginx.out, its error log dir/error.log). It returns at once: the
// caller waits for it in the way that suits what it counts.
func StartNginx(t testing.TB, h *testnet.Host, servers string) (d *Daemon, dir string) {
	t.Helper()
	dir = t.TempDir()
	conf := WriteNginxConf(t, dir, servers)
	d = StartDaemon(t, h, dir, "nginx", syscall.SIGTERM, "nginx", "-p", dir, "-e", filepath.Join(dir, "error.log"), "-c", conf)
	return d, dir
}
