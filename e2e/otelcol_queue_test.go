package e2e

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/nodeagent"
	"github.com/sandboxstats/sandboxstats/internal/testenv"
)

// TestIntegrationCollectorPersistentQueue runs deploy/otel/collector.yaml
// as a node runs it (deployCollector) forwarding to a gateway, and kills
// the node's Collector while it holds usage events the gateway has not
// had. Round a is sent and arrives; the gateway is stopped; round b is sent
// one request after another and the node is SIGKILLed while requests are
// still arriving; it is started again, round c is sent, and the gateway
// comes back. Every record whose request the node acknowledged (HTTP 200)
// arrives at the gateway, deduplicated by log.record.uid; the duplicates
// (records sent again after the kill) and the records of requests the
// kill cut off that arrived all the same are counted and logged.
//
// The subtest in-memory runs the same with the queue's storage removed
// (the file's queue without file_storage, as the file was before): round b
// is lost, which shows the test sees a loss where there is one.
func TestIntegrationCollectorPersistentQueue(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the test collector")
	}
	for _, tc := range []struct {
		name      string
		overrides []string
		wantLoss  bool
	}{
		{name: "file_storage"},
		{name: "in-memory", overrides: []string{"exporters::otlp_grpc/gateway::sending_queue::storage: null"}, wantLoss: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			storage := t.TempDir()
			gateway := testenv.StartCollector(t)
			node := deployCollector(t, gateway, storage, tc.overrides...)
			s := &eventSender{url: node.HTTPEndpoint() + "/v1/logs", client: &http.Client{Timeout: 5 * time.Second}}

			if err := s.send("a", 0); err != nil {
				t.Fatal(err)
			}
			waitArrived(t, gateway, s.acked("a"))
			gateway.Stop(t)

			// Round b: requests one after another until the kill cuts one.
			killed := make(chan struct{})
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ; i++ {
					if err := s.send("b", i); err != nil {
						select {
						case <-killed:
						default:
							t.Errorf("round b, request %d, before the kill: %v", i, err)
						}
						return
					}
				}
			}()
			for deadline := time.Now().Add(15 * time.Second); len(s.acked("b")) < 20*recordsPerRequest; time.Sleep(5 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("round b: %d records acknowledged within 15 s, want %d", len(s.acked("b")), 20*recordsPerRequest)
				}
			}
			close(killed)
			node.Kill(t)
			wg.Wait()
			if tc.name == "file_storage" {
				if ents, err := os.ReadDir(storage); err != nil || len(ents) == 0 {
					t.Fatalf("the queue's storage %s: %d files, %v", storage, len(ents), err)
				}
			}

			node.Start(t)
			if err := s.send("c", 0); err != nil {
				t.Fatal(err)
			}
			gateway.Start(t)
			got := waitArrived(t, gateway, s.acked("c"))
			if !tc.wantLoss {
				got = waitArrived(t, gateway, s.acked("a", "b", "c"))
			}

			acked := s.acked("a", "b", "c")
			var lost, dups, unacked int
			for _, uid := range acked {
				if got[uid] == 0 {
					lost++
				}
			}
			for uid, n := range got {
				dups += n - 1
				if !s.isAcked(uid) {
					unacked++
				}
			}
			t.Logf("%s: %d records acknowledged (round b: %d in %d requests before the kill), %d lost, %d arrived %d times in all (%d duplicates), %d of requests the kill cut off arrived",
				tc.name, len(acked), len(s.acked("b")), len(s.acked("b"))/recordsPerRequest, lost, len(got), len(got)+dups, dups, unacked)
			if tc.wantLoss && lost == 0 {
				t.Errorf("%s: no acknowledged record lost to the kill: the test cannot tell the persistent queue from this one", tc.name)
			}
			if !tc.wantLoss && lost != 0 {
				t.Errorf("%s: %d acknowledged records lost", tc.name, lost)
			}
		})
	}
}

// recordsPerRequest is how many usage events eventSender puts in a request.
const recordsPerRequest = 10

// eventSender posts final usage events over OTLP/HTTP JSON, each with its
// log.record.uid, and keeps the uids of the requests that were
// acknowledged.
type eventSender struct {
	url    string
	client *http.Client

	mu    sync.Mutex
	acks  map[string][]string // round -> uids acknowledged
	isAck map[string]bool
}

// send posts request i of round: recordsPerRequest events, uids
// "<round>-<i>-<j>". A request the node did not acknowledge with 200 is an
// error.
func (s *eventSender) send(round string, i int) error {
	uids := make([]string, recordsPerRequest)
	recs := make([]string, recordsPerRequest)
	now := time.Now().UnixNano()
	for j := range uids {
		uids[j] = fmt.Sprintf("%s-%d-%d", round, i, j)
		recs[j] = fmt.Sprintf(`{"timeUnixNano":"%d","eventName":%q,"attributes":[`+
			`{"key":"log.record.uid","value":{"stringValue":%q}},`+
			`{"key":"sandboxstats.stats.kind","value":{"stringValue":%q}},`+
			`{"key":"sandboxstats.stats.cpu.time","value":{"doubleValue":%d.5}}]}`,
			now, nodeagent.EventUsageSampled, uids[j], nodeagent.KindFinal, j)
	}
	body := `{"resourceLogs":[{"resource":{"attributes":[{"key":"service.name","value":{"stringValue":"statsagent"}}]},` +
		`"scopeLogs":[{"scope":{"name":"e2e"},"logRecords":[` + strings.Join(recs, ",") + `]}]}]}`
	resp, err := s.client.Post(s.url, "application/json", strings.NewReader(body))
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return errors.New("POST " + s.url + ": " + resp.Status)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.acks == nil {
		s.acks, s.isAck = map[string][]string{}, map[string]bool{}
	}
	s.acks[round] = append(s.acks[round], uids...)
	for _, u := range uids {
		s.isAck[u] = true
	}
	return nil
}

// acked returns the uids of rounds acknowledged so far.
func (s *eventSender) acked(rounds ...string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var uids []string
	for _, r := range rounds {
		uids = append(uids, s.acks[r]...)
	}
	return uids
}

func (s *eventSender) isAcked(uid string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.isAck[uid]
}

// waitArrived waits up to 20 s until every one of uids has arrived at
// gateway and returns how many times each log.record.uid arrived.
func waitArrived(t *testing.T, gateway *testenv.Collector, uids []string) map[string]int {
	t.Helper()
	var got map[string]int
	gateway.WaitLogs(t, 20*time.Second, func(logs []testenv.CollectedLog) bool {
		got = map[string]int{}
		for _, l := range logs {
			if uid, ok := l.Attributes["log.record.uid"].(string); ok && l.EventName == nodeagent.EventUsageSampled {
				got[uid]++
			}
		}
		for _, u := range uids {
			if got[u] == 0 {
				return false
			}
		}
		return true
	})
	return got
}
