package monitor

import (
	"strings"
	"testing"
	"time"
)

// TestHealthInCluster: what a node of a cluster reports, from the Report a
// check produced.
func TestHealthInCluster(t *testing.T) {
	running := WorkerStatus{Configured: 1, Running: true}
	stream := StreamStatus{Name: "ORDERS", Exists: true, Leader: "n1"}
	consumer := ConsumerStatus{Stream: "ORDERS", Name: "WORKER1", Exists: true, Workers: running}
	timeout := "context deadline exceeded"
	unavailable := "nats: API error: code=503 err_code=10008 description=JetStream system temporarily unavailable"
	for _, tc := range []struct {
		name   string
		r      Report
		status string
		reason string // a part of the first problem
	}{
		{"all current", Report{Cluster: &ClusterView{Current: 3, Size: 3}, JetStream: JetStreamStatus{Enabled: true},
			Streams: []StreamStatus{stream}, Consumers: []ConsumerStatus{consumer}}, HealthOK, ""},
		{"one peer catching up, quorum kept", Report{Cluster: &ClusterView{Current: 2, Size: 3}, JetStream: JetStreamStatus{Enabled: true},
			Streams: []StreamStatus{stream}, Consumers: []ConsumerStatus{consumer}}, HealthOK, ""},
		{"one peer down, quorum kept", Report{Cluster: &ClusterView{Current: 2, Size: 3, Down: []DownPeer{{Name: "n3"}}}, JetStream: JetStreamStatus{Enabled: true},
			Streams: []StreamStatus{stream}, Consumers: []ConsumerStatus{consumer}}, HealthDegraded, "can survive no further node loss"},
		{"minority: the API does not answer", Report{Cluster: &ClusterView{Current: 1, Size: 3, IsolatedFor: 5 * time.Second},
			JetStream: JetStreamStatus{Error: timeout},
			Streams:   []StreamStatus{{Name: "ORDERS", Error: timeout}},
			Consumers: []ConsumerStatus{{Stream: "ORDERS", Name: "WORKER1", Error: timeout, Workers: running}}},
			HealthDegraded, "sees 1 of the 3 nodes of its cluster: no quorum"},
		{"minority for longer than the bound", Report{Cluster: &ClusterView{Current: 1, Size: 3, IsolatedFor: isolatedAfter + time.Second},
			JetStream: JetStreamStatus{Error: timeout}, Streams: []StreamStatus{{Name: "ORDERS", Error: timeout}}},
			HealthUnhealthy, "reached none of its peers for 1m1s"},
		{"minority and a missing stream", Report{Cluster: &ClusterView{Current: 1, Size: 3},
			JetStream: JetStreamStatus{Enabled: true}, Streams: []StreamStatus{{Name: "ORDERS", Error: errStreamMissing}}},
			HealthUnhealthy, "no quorum"},
		{"minority, workers dead", Report{Cluster: &ClusterView{Current: 1, Size: 3}, JetStream: JetStreamStatus{Error: timeout},
			Consumers: []ConsumerStatus{{Stream: "ORDERS", Name: "WORKER1", Exists: true, Workers: WorkerStatus{Configured: 1}}}},
			HealthUnhealthy, "no quorum"},
		{"stream without leader", Report{Cluster: &ClusterView{Current: 2, Size: 3}, JetStream: JetStreamStatus{Enabled: true},
			Streams: []StreamStatus{{Name: "ORDERS", Exists: true, Leaderless: true}}, Consumers: []ConsumerStatus{consumer}},
			HealthDegraded, "stream ORDERS has no leader"},
		{"consumer without leader", Report{Cluster: &ClusterView{Current: 3, Size: 3}, JetStream: JetStreamStatus{Enabled: true},
			Streams: []StreamStatus{stream}, Consumers: []ConsumerStatus{{Stream: "ORDERS", Name: "WORKER1", Exists: true, Workers: running, Leaderless: true}}},
			HealthDegraded, "consumer WORKER1 on stream ORDERS has no leader"},
		{"replica catching up", Report{Cluster: &ClusterView{Current: 3, Size: 3}, JetStream: JetStreamStatus{Enabled: true},
			Streams: []StreamStatus{{Name: "ORDERS", Exists: true, Leader: "n1", BehindFor: 5 * time.Second, BehindBy: 900}}}, HealthOK, ""},
		{"replica behind for long", Report{Cluster: &ClusterView{Current: 3, Size: 3}, JetStream: JetStreamStatus{Enabled: true},
			Streams: []StreamStatus{{Name: "ORDERS", Exists: true, Leader: "n1", BehindFor: replicaBehindAfter, BehindBy: 900}}},
			HealthDegraded, "replica of stream ORDERS has not been current with the leader n1 for 30s (900 operations behind)"},
		{"a replaced node lingers", Report{Cluster: &ClusterView{Current: 3, Size: 4, Configured: 3}, JetStream: JetStreamStatus{Enabled: true},
			Streams: []StreamStatus{stream}, Consumers: []ConsumerStatus{consumer}},
			HealthDegraded, "the cluster counts 4 nodes, 3 of them current, but cluster.routes names 3"},
		{"more nodes than routes, all current", Report{Cluster: &ClusterView{Current: 5, Size: 5, Configured: 3}, JetStream: JetStreamStatus{Enabled: true},
			Streams: []StreamStatus{stream}, Consumers: []ConsumerStatus{consumer}}, HealthOK, ""},
		{"single node: API down is unhealthy", Report{JetStream: JetStreamStatus{Error: timeout}}, HealthUnhealthy, "JetStream does not answer"},
		{"quorum kept, leaders being elected", Report{Cluster: &ClusterView{Current: 3, Size: 3},
			JetStream: JetStreamStatus{Error: unavailable, UnavailableFor: 2 * time.Second},
			Consumers: []ConsumerStatus{{Stream: "ORDERS", Name: "WORKER1", Error: unavailable, UnavailableFor: 2 * time.Second, Workers: running}}},
			HealthDegraded, "the cluster is electing leaders: unhealthy if it lasts 20s"},
		{"quorum kept, a consumer unavailable beyond the election grace", Report{Cluster: &ClusterView{Current: 3, Size: 3}, JetStream: JetStreamStatus{Enabled: true},
			Streams: []StreamStatus{stream}, Consumers: []ConsumerStatus{{Stream: "ORDERS", Name: "WORKER1", Error: unavailable, UnavailableFor: electionGrace, Workers: running}}},
			HealthUnhealthy, "consumer WORKER1 on stream ORDERS: nats: API error"},
		{"file storage full", Report{JetStream: JetStreamStatus{Enabled: true, FileUsed: 2_800_000, FileLimit: 1 << 20},
			Streams: []StreamStatus{stream}, Consumers: []ConsumerStatus{consumer}},
			HealthDegraded, "JetStream file storage is full: 2.7 MiB used of jetstream.max_file_store 1.0 MiB"},
		{"file storage nearly full", Report{JetStream: JetStreamStatus{Enabled: true, FileUsed: 1000, FileLimit: 1024},
			Streams: []StreamStatus{stream}, Consumers: []ConsumerStatus{consumer}}, HealthOK, ""},
		{"quorum kept, the API unavailable beyond the election grace", Report{Cluster: &ClusterView{Current: 3, Size: 3},
			JetStream: JetStreamStatus{Error: unavailable, UnavailableFor: electionGrace}}, HealthUnhealthy, "JetStream does not answer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := &Monitor{}
			h := m.evaluate(&tc.r)
			if h.Status != tc.status || !strings.Contains(h.Reason, tc.reason) {
				t.Errorf("health = %s, reason %q (problems %q); want %s with %q", h.Status, h.Reason, h.Problems, tc.status, tc.reason)
			}
		})
	}
}

// TestClusterViewTracksIsolation: the time without any peer starts at the
// first check that sees none and ends with the first that sees one; a
// replica's time behind the leader likewise.
func TestClusterViewTracksIsolation(t *testing.T) {
	current := 1
	m := &Monitor{opts: Options{ServerName: "n2", ClusterPeers: func() (Peers, bool) { return Peers{Current: current, Size: 3}, true }}}
	t0 := time.Now()
	if v := m.clusterView(t0); !v.NoQuorum() || v.IsolatedFor != 0 {
		t.Fatalf("first isolated check: %+v", v)
	}
	if v := m.clusterView(t0.Add(90 * time.Second)); v.IsolatedFor != 90*time.Second {
		t.Fatalf("isolated for %s, want 90s", v.IsolatedFor)
	}
	current = 2
	if v := m.clusterView(t0.Add(91 * time.Second)); v.NoQuorum() || v.IsolatedFor != 0 {
		t.Fatalf("after a peer came back: %+v", v)
	}
	current = 1
	if v := m.clusterView(t0.Add(92 * time.Second)); v.IsolatedFor != 0 {
		t.Fatalf("isolated again: the time starts again, got %s", v.IsolatedFor)
	}
	single := &Monitor{opts: Options{ClusterPeers: func() (Peers, bool) { return Peers{}, false }}}
	if v := single.clusterView(t0); v != nil || v.NoQuorum() {
		t.Fatalf("single node: %+v", v)
	}

	behind := func(current bool, at time.Duration) StreamStatus {
		st := StreamStatus{Name: "ORDERS", Leader: "n1", Replicas: []ReplicaStatus{{Name: "n2", Current: current, Lag: 7}, {Name: "n3", Current: true}}}
		m.trackReplica(&st, t0.Add(at))
		return st
	}
	if st := behind(false, 0); st.BehindFor != 0 || st.BehindBy != 7 {
		t.Fatalf("first check behind: %+v", st)
	}
	if st := behind(false, 40*time.Second); st.BehindFor != 40*time.Second {
		t.Fatalf("behind for %s, want 40s", st.BehindFor)
	}
	if st := behind(true, 41*time.Second); st.BehindFor != 0 || st.BehindBy != 0 {
		t.Fatalf("current again: %+v", st)
	}
	if st := behind(false, 42*time.Second); st.BehindFor != 0 {
		t.Fatalf("behind again: the time starts again, got %s", st.BehindFor)
	}
}

// TestHealthLastQuorum: a cluster that keeps its quorum with one node
// down is degraded, naming the node and when it was last seen; with every
// node current, or outside the quorum, this rule says nothing.
func TestHealthLastQuorum(t *testing.T) {
	now := time.Now()
	m := &Monitor{}
	report := func(current, size int, down ...DownPeer) *Report {
		return &Report{Time: now, JetStream: JetStreamStatus{Enabled: true}, Cluster: &ClusterView{Current: current, Size: size, Down: down}}
	}
	h := m.evaluate(report(2, 3, DownPeer{Name: "n1", Since: now.Add(-65 * time.Second)}))
	if h.Status != HealthDegraded || !strings.Contains(h.Reason, "can survive no further node loss") || !strings.Contains(h.Reason, "n1, last seen 1m5s ago") {
		t.Errorf("one of three down: %s, %q", h.Status, h.Reason)
	}
	if h := m.evaluate(report(3, 5, DownPeer{Name: "n4"}, DownPeer{Name: "n5"})); h.Status != HealthDegraded || !strings.Contains(h.Reason, "down: n4; n5") {
		t.Errorf("two of five down: %s, %q", h.Status, h.Reason)
	}
	if h := m.evaluate(report(4, 5, DownPeer{Name: "n5"})); strings.Contains(h.Reason+strings.Join(h.Problems, " "), "no further node loss") {
		t.Errorf("one of five down: %q %q", h.Reason, h.Problems)
	}
	if h := m.evaluate(report(3, 3)); h.Status != HealthOK {
		t.Errorf("all current: %s, %q", h.Status, h.Reason)
	}
	if h := m.evaluate(report(2, 3)); h.Status != HealthOK {
		t.Errorf("a peer back and catching up: %s, %q", h.Status, h.Reason)
	}
}

// TestNoteUnavailable: on a clustered node the time a consumer, a stream
// or the API answers as during an election is counted from the first check
// that saw it, and forgotten once it answers; a single node counts none.
func TestNoteUnavailable(t *testing.T) {
	m := &Monitor{}
	unavailable := "nats: API error: code=503 err_code=10008 description=JetStream system temporarily unavailable"
	start := time.Now()
	report := func(cluster bool, err string) *Report {
		r := &Report{JetStream: JetStreamStatus{Enabled: true}, Consumers: []ConsumerStatus{{Stream: "ORDERS", Name: "WORKER1", Exists: err == "", Error: err}}}
		if cluster {
			r.Cluster = &ClusterView{Current: 3, Size: 3}
		}
		return r
	}
	r := report(true, unavailable)
	m.noteUnavailable(r, start)
	if d := r.Consumers[0].UnavailableFor; d <= 0 || d > time.Millisecond {
		t.Fatalf("first check: unavailable for %s", d)
	}
	r = report(true, unavailable)
	m.noteUnavailable(r, start.Add(5*time.Second))
	if d := r.Consumers[0].UnavailableFor; d != 5*time.Second {
		t.Fatalf("second check 5 s later: unavailable for %s", d)
	}
	m.noteUnavailable(report(true, ""), start.Add(6*time.Second))
	r = report(true, unavailable)
	m.noteUnavailable(r, start.Add(7*time.Second))
	if d := r.Consumers[0].UnavailableFor; d > time.Millisecond {
		t.Fatalf("after it answered once: unavailable for %s, want counted anew", d)
	}
	r = report(false, unavailable)
	m.noteUnavailable(r, start.Add(8*time.Second))
	if d := r.Consumers[0].UnavailableFor; d != 0 {
		t.Fatalf("single node: unavailable for %s, want none counted", d)
	}
}
