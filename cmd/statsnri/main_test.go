package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
	nrilog "github.com/containerd/nri/pkg/log"

	"github.com/sandboxstats/sandboxstats/internal/nrifake"
	"github.com/sandboxstats/sandboxstats/internal/statsdfake"
	"github.com/sandboxstats/sandboxstats/internal/testenv"
)

func TestMain(m *testing.M) {
	nrilog.Set(quietNRI{}) // the NRI runtime side the tests run
	os.Exit(m.Run())
}

type quietNRI struct{}

func (quietNRI) Debugf(context.Context, string, ...any) {}
func (quietNRI) Infof(context.Context, string, ...any)  {}
func (quietNRI) Warnf(context.Context, string, ...any)  {}
func (quietNRI) Errorf(context.Context, string, ...any) {}

var addrRE = regexp.MustCompile(`msg="statsnri serving" addr=(\S+)`)

// shortDir is a temporary directory whose sockets' paths fit (107 bytes).
func shortDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "nri")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within 10s: %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestServe: statsnri started before NRI is up says so on /healthz,
// connects once it is, binds and checkpoints a pod through NRI's events,
// logs each, counts them on /metrics, and stops cleanly.
func TestServe(t *testing.T) {
	f := statsdfake.StartLifecycle(t, shortDir(t))
	nriDir := shortDir(t)
	logs := &testenv.SyncBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{
			"--statsd", f.LifecycleSocket + "," + f.StatsSocket,
			"--nri-socket", "unix://" + filepath.Join(nriDir, "nri.sock"),
			"--handlers", "runsc,kata*,runc", "--metrics-listen", "127.0.0.1:0", "--log-level", "debug",
			"--placement-key-file", filepath.Join(t.TempDir(), "placement.key"),
		}, logs)
	}()
	defer func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("run returned %v after shutdown", err)
			}
		case <-time.After(5 * time.Second):
			t.Error("statsnri did not stop within 5s")
		}
	}()
	var base string
	waitFor(t, "serving", func() bool {
		m := addrRE.FindStringSubmatch(logs.String())
		if m != nil {
			base = "http://" + m[1]
		}
		return m != nil
	})
	if code, body := get(t, base+"/healthz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "not connected to NRI") {
		t.Errorf("/healthz before NRI: %d %q", code, body)
	}

	pod := func(i int, handler string) *api.PodSandbox {
		return &api.PodSandbox{Id: fmt.Sprintf("sbx%d", i), Uid: fmt.Sprintf("uid-%d", i), Name: fmt.Sprintf("web-%d", i), Namespace: "shop",
			Labels: map[string]string{"sandboxstats.dev/template": "python"}, RuntimeHandler: handler, Pid: uint32(1000 + i),
			Linux: &api.LinuxPodSandbox{CgroupsPath: fmt.Sprintf("/k8s.io/sbx%d", i)}}
	}
	rt := nrifake.Start(t, nriDir, pod(1, "runsc"))
	waitFor(t, "connected", func() bool { code, _ := get(t, base+"/healthz"); return code == http.StatusOK })
	rt.WaitPlugins(t, 1)
	waitFor(t, "the synchronized pod bound", func() bool { _, ok := f.Bound()["uid-1"]; return ok })

	rctx := context.Background()
	if err := rt.RunPodSandbox(rctx, &api.RunPodSandboxRequest{Pod: pod(2, "")}); err != nil { // runc, the default runtime
		t.Fatal(err)
	}
	if err := rt.RunPodSandbox(rctx, &api.RunPodSandboxRequest{Pod: pod(3, "crun")}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the runc pod bound by its cgroup", func() bool { return f.Bound()["uid-2"].GetSandbox().GetCgroupPath() == "/k8s.io/sbx2" })
	if err := rt.StopPodSandbox(rctx, &api.StopPodSandboxRequest{Pod: pod(1, "runsc")}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the stopped pod checkpointed", func() bool { return strings.Contains(logs.String(), `msg="checkpointed pod"`) })
	if _, ok := f.Bound()["uid-1"]; ok {
		t.Error("the stopped pod is still bound")
	}

	_, metrics := get(t, base+"/metrics")
	for _, want := range []string{
		"sandboxstats_nri_connected 1",
		"sandboxstats_nri_connections_total 1",
		`sandboxstats_nri_events_total{event="run-pod-sandbox"} 2`,
		`sandboxstats_nri_events_total{event="stop-pod-sandbox"} 1`,
		`sandboxstats_nri_events_total{event="synchronize"} 1`,
		`sandboxstats_nri_pod_events_ignored_total{reason="handler"} 1`,
		fmt.Sprintf(`sandboxstats_nri_statsd_calls_total{call="run",result="ok",statsd=%q} 2`, f.LifecycleSocket),
		fmt.Sprintf(`sandboxstats_nri_statsd_calls_total{call="checkpoint",result="ok",statsd=%q} 1`, f.LifecycleSocket),
		"sandboxstats_nri_pods 1",
		fmt.Sprintf(`sandboxstats_nri_statsd_bindings{statsd=%q} 1`, f.LifecycleSocket),
	} {
		if !strings.Contains(metrics, want+"\n") {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	for _, want := range []string{
		`msg="connected to NRI" component=nri socket=` + filepath.Join(nriDir, "nri.sock"),
		`msg="nri: synchronized" component=nri pods=1 containers=0 watched_running=1`,
		`msg="bound pod" component=nri uid=uid-1 namespace=shop name=web-1 sandbox=sbx1 kind=gvisor`,
		`msg="bound pod" component=nri uid=uid-2 namespace=shop name=web-2 sandbox=sbx2 kind=cgroup`,
		`msg="checkpointed pod" component=nri uid=uid-1 namespace=shop name=web-1`,
	} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("log lacks %s:\n%s", want, logs)
		}
	}
}
