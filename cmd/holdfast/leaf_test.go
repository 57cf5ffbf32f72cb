package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/crypto/bcrypt"

	"github.com/holdfast-io/holdfast/internal/natstest"
	"github.com/holdfast-io/holdfast/internal/testcert"
)

// leafNode is one holdfast of an edge/hub test on 127.0.0.1.
type leafNode struct {
	name     string
	inst     *e2eInstance
	leafPort int // the hub's leafnode listener
	httpAddr string
	proc     *e2eProc
}

// newLeafHub writes the config of a hub: domain "hub", a leafnode
// listener, and the one stream EDGE on edge.> with the given duplicate
// window; no per-edge configuration.
func newLeafHub(t *testing.T, duplicateWindow, extra string) *leafNode {
	t.Helper()
	n := &leafNode{name: "hub", leafPort: natstest.FreePort(t), httpAddr: fmt.Sprintf("127.0.0.1:%d", natstest.FreePort(t))}
	n.inst = &e2eInstance{store: filepath.Join(t.TempDir(), "store"), port: natstest.FreePort(t)}
	n.inst.cfg = e2eWriteConfig(t, fmt.Sprintf(`[server]
name = "hub"
host = "127.0.0.1"
port = %d

[jetstream]
store_dir = %q
max_file_store = "1GB"
max_memory_store = "64MB"
domain = "hub"

[http]
listen = %q

[leafnodes]
listen = "127.0.0.1:%d"
no_advertise = true

[streams.EDGE]
subjects = ["edge.>"]
duplicate_window = %q
%s`, n.inst.port, n.inst.store, n.httpAddr, n.leafPort, duplicateWindow, extra))
	return n
}

// newLeafEdge writes the config of an edge named name: ORDERS on orders.*,
// the consumer FORWARD with the forward handler (its one worker), and one
// remote at hubAddr (the hub's leafnode port, or a proxy in front of it).
func newLeafEdge(t *testing.T, name, hubAddr, extra string) *leafNode {
	t.Helper()
	n := &leafNode{name: name, httpAddr: fmt.Sprintf("127.0.0.1:%d", natstest.FreePort(t))}
	n.inst = &e2eInstance{store: filepath.Join(t.TempDir(), "store"), port: natstest.FreePort(t)}
	n.inst.cfg = e2eWriteConfig(t, fmt.Sprintf(`[server]
name = %q
host = "127.0.0.1"
port = %d

[jetstream]
store_dir = %q
max_file_store = "1GB"
max_memory_store = "64MB"

[http]
listen = %q

[[leafnodes.remotes]]
url = "nats-leaf://%s"

[streams.ORDERS]
subjects = ["orders.*"]

[consumers.FORWARD]
stream = "ORDERS"
handler = "forward"
backoff = ["100ms"]
%s`, name, n.inst.port, n.inst.store, n.httpAddr, hubAddr, extra))
	return n
}

func (n *leafNode) start(t *testing.T) {
	t.Helper()
	n.proc = startHoldfast(t, n.inst.cfg)
	n.proc.waitReady()
}

// startLeafPair starts a hub (newLeafHub with duplicateWindow and
// hubExtra) and an edge "edge1" linked to it (edgeExtra), connects a
// client to each, and stops both when the test ends, each required to
// stop cleanly (edge first; one a test stopped itself is left alone).
func startLeafPair(t *testing.T, duplicateWindow, hubExtra, edgeExtra string) (hub, edge *leafNode, hjs, ejs jetstream.JetStream) {
	t.Helper()
	hub = newLeafHub(t, duplicateWindow, hubExtra)
	hub.start(t)
	t.Cleanup(func() {
		if !hub.proc.exited() {
			hub.proc.stop()
		}
	})
	edge = newLeafEdge(t, "edge1", fmt.Sprintf("127.0.0.1:%d", hub.leafPort), edgeExtra)
	edge.start(t)
	t.Cleanup(func() {
		if !edge.proc.exited() {
			edge.proc.stop()
		}
	})
	_, ejs = e2eConnect(t, edge.inst)
	_, hjs = e2eConnect(t, hub.inst)
	return hub, edge, hjs, ejs
}

func (n *leafNode) get(t *testing.T, path string) string {
	t.Helper()
	resp, err := http.Get("http://" + n.httpAddr + path)
	if err != nil {
		t.Fatalf("GET %s on %s: %v", path, n.name, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// leafPublish publishes count messages to the edge with PubAck, subjects
// alternating over two, numbered from first; it returns how many were
// acknowledged, and fails the test on a publish error or a missing PubAck.
func leafPublish(t *testing.T, js jetstream.JetStream, first, count int) {
	t.Helper()
	ctx := natstest.Context(t)
	var futures []jetstream.PubAckFuture
	for i := first; i < first+count; i++ {
		subj := "orders.created"
		if i%2 == 1 {
			subj = "orders.paid"
		}
		f, err := js.PublishAsync(subj, []byte(strconv.Itoa(i)))
		if err != nil {
			t.Fatal(err)
		}
		futures = append(futures, f)
		if len(futures) == 500 {
			leafAwait(t, ctx, futures)
			futures = futures[:0]
		}
	}
	leafAwait(t, ctx, futures)
}

func leafAwait(t *testing.T, ctx context.Context, futures []jetstream.PubAckFuture) {
	t.Helper()
	for _, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			t.Fatalf("publish to the edge: %v", err)
		case <-ctx.Done():
			t.Fatal("PubAck timeout")
		}
	}
}

// hubCounts waits until the hub's stream holds want messages and no more
// arrive, then reads every message and returns, per edge, how many times
// each origin sequence was stored; it fails on a repeated Nats-Msg-Id.
func hubCounts(t *testing.T, js jetstream.JetStream, want uint64, within time.Duration) map[string]map[uint64]int {
	t.Helper()
	counts, _ := hubRead(t, js, want, within)
	return counts
}

// hubRead is hubCounts that also returns each edge's origin sequences in
// the order the hub stored them.
func hubRead(t *testing.T, js jetstream.JetStream, want uint64, within time.Duration) (map[string]map[uint64]int, map[string][]uint64) {
	t.Helper()
	natstest.CheckFor(t, within, 100*time.Millisecond, func() error {
		if n := natstest.StreamInfo(t, js, "EDGE").State.Msgs; n != want {
			return fmt.Errorf("hub EDGE holds %d messages, want %d", n, want)
		}
		return nil
	})
	time.Sleep(500 * time.Millisecond) // a duplicate would arrive now
	if n := natstest.StreamInfo(t, js, "EDGE").State.Msgs; n != want {
		t.Fatalf("hub EDGE holds %d messages after settling, want %d", n, want)
	}
	// Message by message with the get API: no consumer to create, which
	// a hub cluster that just lost a node may not answer for a long time
	// (an ordered consumer's Fetch hung a CI run). Each get is retried.
	s, err := js.Stream(natstest.Context(t), "EDGE")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[uint64]int{}
	order := map[string][]uint64{}
	ids := map[string]bool{}
	last := natstest.StreamInfo(t, js, "EDGE").State.LastSeq
	for seq := uint64(1); seq <= last; seq++ {
		var m *jetstream.RawStreamMsg
		natstest.CheckFor(t, within, 100*time.Millisecond, func() (err error) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			m, err = s.GetMsg(ctx, seq)
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				m, err = nil, nil
			}
			return err
		})
		if m == nil {
			continue // deleted
		}
		id := m.Header.Get(nats.MsgIdHdr)
		if ids[id] {
			t.Fatalf("Nats-Msg-Id %s stored twice", id)
		}
		ids[id] = true
		edge := m.Header.Get("Holdfast-Origin-Server")
		oseq, _ := strconv.ParseUint(m.Header.Get("Holdfast-Origin-Seq"), 10, 64)
		if !strings.HasPrefix(m.Subject, "edge."+edge+".orders.") {
			t.Fatalf("subject %s from edge %q", m.Subject, edge)
		}
		// <server>:<stream>:<seq>:<stored>
		if parts := strings.Split(id, ":"); len(parts) != 4 || parts[0] != edge || parts[1] != "ORDERS" || parts[2] != strconv.FormatUint(oseq, 10) {
			t.Fatalf("Nats-Msg-Id %s does not name edge %s, stream ORDERS and seq %d", id, edge, oseq)
		}
		if out[edge] == nil {
			out[edge] = map[uint64]int{}
		}
		out[edge][oseq]++
		order[edge] = append(order[edge], oseq)
	}
	if n := uint64(len(ids)); n != want {
		t.Fatalf("read %d of %d messages from the hub", n, want)
	}
	return out, order
}

// wantExactlyOnce checks that each edge's sequences 1..n arrived once.
func wantExactlyOnce(t *testing.T, seen map[string]map[uint64]int, edges map[string]uint64) {
	t.Helper()
	for edge, n := range edges {
		for seq := uint64(1); seq <= n; seq++ {
			if c := seen[edge][seq]; c != 1 {
				t.Errorf("edge %s seq %d stored %d times on the hub", edge, seq, c)
			}
		}
		if len(seen[edge]) != int(n) {
			t.Errorf("edge %s: %d sequences on the hub, want %d", edge, len(seen[edge]), n)
		}
	}
}

// TestLeafEdgesToHub: two edges forward to one hub over leafnodes. Every
// message each edge acknowledged is stored once on the hub (by origin
// header and Nats-Msg-Id) and in each edge's order (one forward worker),
// the edges' local streams stay apart, a message
// too large for the hub's stream is dead-lettered on the edge with the
// reason and the rest flow past it; status and metrics show the links,
// the backlog and, on the hub, each edge's last sequence.
func TestLeafEdgesToHub(t *testing.T) {
	t.Parallel()
	// The hub and edge1 authenticate clients ([auth]), the hub its
	// leafnodes (user and password file); edge2 has no [auth].
	dir := t.TempDir()
	leafPw := filepath.Join(dir, "leaf.password")
	if err := os.WriteFile(leafPw, []byte("leaf-secret-password\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	hash, err := bcrypt.GenerateFromPassword([]byte(leafAppPassword), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	appUser := fmt.Sprintf("\n[auth.users.app]\npassword = %q\n", hash)
	hub := newLeafHub(t, "10m", appUser)
	// The hub's stream takes messages up to 2KB.
	text := strings.Replace(readFile(t, hub.inst.cfg), "port = ", "max_payload = \"2KB\"\nport = ", 1)
	text = strings.Replace(text, "no_advertise = true\n", fmt.Sprintf("no_advertise = true\nuser = \"leaf\"\npassword_file = %q\n", leafPw), 1)
	hub.inst.cfg = e2eWriteConfig(t, text)
	hub.start(t)
	hubAddr := fmt.Sprintf("127.0.0.1:%d", hub.leafPort)
	remoteAuth := fmt.Sprintf("\"\nuser = \"leaf\"\npassword_file = %q\n", leafPw)
	e1 := newLeafEdge(t, "edge1", hubAddr, appUser)
	e1.inst.cfg = e2eWriteConfig(t, strings.Replace(readFile(t, e1.inst.cfg), hubAddr+"\"\n", hubAddr+remoteAuth, 1))
	e2 := newLeafEdge(t, "edge2", hubAddr, "")
	e2.inst.cfg = e2eWriteConfig(t, strings.Replace(readFile(t, e2.inst.cfg), hubAddr+"\"\n", hubAddr+remoteAuth, 1))
	e1.start(t)
	e2.start(t)
	hjs := leafConnect(t, hub, "app")

	// Order and once-only need no volume: 2,000 messages show them as
	// 10,000 did, for a third of the CPU.
	const perEdge = 1000
	start := time.Now()
	var wg sync.WaitGroup
	for i, e := range []*leafNode{e1, e2} {
		js := leafConnect(t, e, map[*leafNode]string{e1: "app"}[e])
		wg.Add(1)
		go func() {
			defer wg.Done()
			leafPublish(t, js, 0, perEdge/2)
			if i == 0 {
				// Too large for the hub (its EDGE stream takes 2KB
				// plus config.ForwardHeadroom): dead-lettered on the edge.
				if _, err := js.Publish(natstest.Context(t), "orders.big", make([]byte, 7000)); err != nil {
					t.Error(err)
				}
			}
			leafPublish(t, js, perEdge/2, perEdge/2)
		}()
	}
	wg.Wait()
	seen, order := hubRead(t, hjs, 2*perEdge, 60*time.Second)
	took := time.Since(start)
	// One forward worker and no failures: the hub stores each edge's
	// messages in their edge order.
	for edge, seqs := range order {
		for i := 1; i < len(seqs); i++ {
			if seqs[i] <= seqs[i-1] {
				t.Errorf("edge %s: seq %d stored after %d", edge, seqs[i], seqs[i-1])
				break
			}
		}
	}
	t.Logf("%d messages from 2 edges stored once on the hub in %s (%.0f msg/s, publishing included)", 2*perEdge, took.Round(time.Millisecond), 2*perEdge/took.Seconds())
	// edge1's big message took sequence perEdge/2+1.
	for seq := uint64(1); seq <= perEdge+1; seq++ {
		c := seen["edge1"][seq]
		if seq == perEdge/2+1 {
			if c != 0 {
				t.Errorf("the oversized message reached the hub")
			}
			continue
		}
		if c != 1 {
			t.Errorf("edge1 seq %d stored %d times", seq, c)
		}
	}
	wantExactlyOnce(t, map[string]map[uint64]int{"edge2": seen["edge2"]}, map[string]uint64{"edge2": perEdge})

	// Local streams stayed local.
	for _, e := range []*leafNode{e1, e2} {
		js := leafConnect(t, e, map[*leafNode]string{e1: "app"}[e])
		want := uint64(perEdge)
		if e == e1 {
			want++
		}
		if n := natstest.StreamInfo(t, js, "ORDERS").State.Msgs; n != want {
			t.Errorf("%s ORDERS holds %d messages, want its own %d", e.name, n, want)
		}
	}
	js1 := leafConnect(t, e1, "app")
	dl, err := js1.Stream(natstest.Context(t), "ORDERS_DLQ")
	if err != nil {
		t.Fatal(err)
	}
	m, err := dl.GetLastMsgForSubject(natstest.Context(t), "dlq.FORWARD.orders.big")
	if err != nil {
		t.Fatalf("no dead letter for the oversized message: %v", err)
	}
	if reason := m.Header.Get("Holdfast-Error"); !strings.Contains(reason, "max_msg_size") {
		t.Errorf("dead letter reason %q does not name the hub's limit", reason)
	}

	metrics := e1.get(t, "/metrics")
	for _, want := range []string{`holdfast_leafnode_connected{remote="nats-leaf://` + hubAddr + `"} 1`,
		`holdfast_forward_messages_total{consumer="FORWARD"}`, `holdfast_forward_refused_total{consumer="FORWARD"} 1`,
		`holdfast_forward_backlog_messages{consumer="FORWARD"} 0`, `holdfast_forward_oldest_unforwarded_age_seconds{consumer="FORWARD"} 0`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("edge metrics lack %s", want)
		}
	}
	hm := hub.get(t, "/metrics")
	for _, want := range []string{fmt.Sprintf(`holdfast_edge_last_seq{edge="edge2",stream="ORDERS"} %d`, perEdge),
		`holdfast_edge_linked{edge="edge2",stream="ORDERS"} 1`, `holdfast_edge_pending_messages{edge="edge2",stream="ORDERS"} 0`} {
		if !strings.Contains(hm, want) {
			t.Errorf("hub metrics lack %s:\n%s\n%s", want, grepLines(hm, "holdfast_edge_"), hub.get(t, "/nats/leafz"))
		}
	}
	st := runHoldfast(t, nil, "status", "--config", e1.inst.cfg, "--user", "app", "--password", leafAppPassword)
	for _, want := range []string{"Leafnode   nats-leaf://" + hubAddr + " connected", "Forward    FORWARD (stream ORDERS) -> domain hub: ready", "backlog 0"} {
		if !strings.Contains(st.stdout, want) {
			t.Errorf("edge status lacks %q:\n%s", want, st.stdout)
		}
	}
	st = runHoldfast(t, nil, "status", "--config", hub.inst.cfg, "--user", "app", "--password", leafAppPassword)
	if !strings.Contains(st.stdout, fmt.Sprintf("Edge       edge2 stream ORDERS: linked, last seq %d, 0 waiting there then", perEdge)) {
		t.Errorf("hub status lacks edge2:\n%s", st.stdout)
	}
}

// leafAppPassword is the password of the user app on nodes with [auth].
const leafAppPassword = "app-password-for-tests"

// leafConnect connects to n as user (with leafAppPassword; "" for none).
func leafConnect(t *testing.T, n *leafNode, user string) jetstream.JetStream {
	t.Helper()
	opts := []nats.Option{nats.MaxReconnects(0)}
	if user != "" {
		opts = append(opts, nats.UserInfo(user, leafAppPassword))
	}
	nc, err := nats.Connect(n.inst.url(), opts...)
	if err != nil {
		t.Fatalf("connect to %s: %v", n.name, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

func grepLines(text, prefix string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestLeafHubOutages: an edge forwards through a TCP proxy the test
// controls. The link is cut while the edge takes 1,000 messages (the
// edge's health degrades after unreachable_after, its metrics show the
// link down and the backlog); after healing everything arrives once.
// Then the hub is killed (kill -9) in the middle of forwarding, the edge
// takes more messages while the hub is away, the hub restarts on its
// store; then the edge is killed (kill -9) in the middle of forwarding and
// restarts: everything arrives once, no intervention. The hub's duplicate
// window is 2s, shorter than each outage: the hub's position, read back
// after each reconnect, keeps what was in flight at each cut from being
// stored twice.
func TestLeafHubOutages(t *testing.T) {
	t.Parallel()
	hub := newLeafHub(t, "2s", "")
	hub.start(t)
	proxy := newTCPProxy(t, fmt.Sprintf("127.0.0.1:%d", hub.leafPort), nil)
	edge := newLeafEdge(t, "edge1", proxy.addr(), "\n[consumers.FORWARD.forward]\ntimeout = \"1s\"\n")
	edge.inst.cfg = e2eWriteConfig(t, strings.Replace(readFile(t, edge.inst.cfg), "[[leafnodes.remotes]]",
		"[leafnodes]\nunreachable_after = \"2s\"\n\n[[leafnodes.remotes]]", 1))
	edge.start(t)
	_, ejs := e2eConnect(t, edge.inst)
	_, hjs := e2eConnect(t, hub.inst)

	leafPublish(t, ejs, 0, 500)
	hubCounts(t, hjs, 500, 30*time.Second)

	// 1. The link is cut; the edge keeps taking messages.
	proxy.Cut()
	natstest.CheckFor(t, 10*time.Second, 100*time.Millisecond, func() error {
		if m := edge.get(t, "/metrics"); !strings.Contains(m, `holdfast_leafnode_connected{remote="nats-leaf://`+proxy.addr()+`"} 0`) {
			return fmt.Errorf("link still up:\n%s", grepLines(m, "holdfast_leafnode_connected"))
		}
		return nil
	})
	backlog := leafBacklog(t)
	leafPublish(t, ejs, 500, backlog)
	natstest.CheckFor(t, 10*time.Second, 200*time.Millisecond, func() error {
		if h := edge.get(t, "/healthz"); !strings.Contains(h, `"degraded"`) || !strings.Contains(h, "unreachable for") {
			return fmt.Errorf("healthz: %s", h)
		}
		return nil
	})
	if m := edge.get(t, "/metrics"); !strings.Contains(m, fmt.Sprintf(`holdfast_forward_backlog_messages{consumer="FORWARD"} %d`, backlog)) {
		t.Errorf("backlog during the cut:\n%s", grepLines(m, "holdfast_forward_"))
	}
	healed := time.Now()
	proxy.Heal()
	hubCounts(t, hjs, uint64(500+backlog), 120*time.Second)
	t.Logf("catch-up after the cut: %d messages in %s (%.0f msg/s, reconnect included)", backlog, time.Since(healed).Round(time.Millisecond), float64(backlog)/time.Since(healed).Seconds())
	natstest.CheckFor(t, 10*time.Second, 200*time.Millisecond, func() error {
		if h := edge.get(t, "/healthz"); !strings.Contains(h, `"ok"`) {
			return fmt.Errorf("healthz after healing: %s", h)
		}
		return nil
	})

	// 2. kill -9 of the hub in the middle of forwarding, publishing on.
	sent := 500 + backlog
	leafPublish(t, ejs, sent, 2000)
	hubHoldsAtLeast(t, hjs, uint64(sent+100))
	hub.proc.signal(syscall.SIGKILL)
	leafPublish(t, ejs, sent+2000, 500)
	sent += 2500
	time.Sleep(3 * time.Second) // past the hub's duplicate window
	hub.start(t)
	_, hjs = e2eConnect(t, hub.inst)
	restarted := time.Now()
	hubCounts(t, hjs, uint64(sent), 60*time.Second)
	t.Logf("after the hub's kill -9 and restart: all %d on the hub %s after the restart", sent, time.Since(restarted).Round(time.Millisecond))

	// 3. kill -9 of the edge in the middle of forwarding; it restarts on
	// its store and goes on where the hub's PubAcks left it.
	leafPublish(t, ejs, sent, 1000)
	hubHoldsAtLeast(t, hjs, uint64(sent+100))
	firstLog := edge.proc.stderr.String()
	edge.proc.signal(syscall.SIGKILL)
	sent += 1000
	time.Sleep(3 * time.Second) // past the hub's duplicate window
	edge.start(t)
	seen := hubCounts(t, hjs, uint64(sent), 60*time.Second)
	wantExactlyOnce(t, seen, map[string]uint64{"edge1": uint64(sent)})
	if !strings.Contains(firstLog, "leafnode disconnected") || !strings.Contains(firstLog, "leafnode connected") {
		t.Error("the edge did not log the link changes")
	}
}

// leafBacklog is how many messages TestLeafHubOutages publishes while the
// link is cut: 1,000, or HOLDFAST_TEST_LEAF_BACKLOG to measure the
// catch-up of a larger backlog.
func leafBacklog(t *testing.T) int {
	t.Helper()
	return leafEnvInt(t, "HOLDFAST_TEST_LEAF_BACKLOG", 1000)
}

// leafEnvInt reads a positive number from the environment variable name,
// or returns def when it is not set.
func leafEnvInt(t *testing.T, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("%s=%q: want a positive number", name, v)
	}
	return n
}

// TestLeafEdgeWaitsForHubWindow: a hub whose stream deduplicates over
// too short a window (1s: forwarding needs twice forward.timeout, 20s)
// does not stop the edge. It starts, stores what its clients publish,
// reports degraded naming the hub's stream and the fix, and forwards once
// the hub's stream is fixed — here by dropping the key, so that hub and
// edge then run on the defaults, which work together.
func TestLeafEdgeWaitsForHubWindow(t *testing.T) {
	t.Parallel()
	hub := newLeafHub(t, "1s", "")
	hub.start(t)
	edge := newLeafEdge(t, "edge1", fmt.Sprintf("127.0.0.1:%d", hub.leafPort), "")
	edge.start(t)
	defer edge.proc.stop()
	_, ejs := e2eConnect(t, edge.inst)
	leafPublish(t, ejs, 0, 20)
	natstest.CheckFor(t, 15*time.Second, 100*time.Millisecond, func() error {
		h := edge.get(t, "/healthz")
		for _, want := range []string{`"degraded"`, "duplicate window is too short", "stream EDGE", `duplicate_window = \"20s\"`} {
			if !strings.Contains(h, want) {
				return fmt.Errorf("/healthz lacks %s:\n%s", want, h)
			}
		}
		return nil
	})
	_, hjs := e2eConnect(t, hub.inst)
	if n := natstest.StreamInfo(t, hjs, "EDGE").State.Msgs; n != 0 {
		t.Fatalf("the hub holds %d: the edge forwarded to a stream whose window is too short", n)
	}
	hub.proc.reloadWith(hub.inst.cfg, strings.Replace(readFile(t, hub.inst.cfg), "duplicate_window = \"1s\"\n", "", 1))
	defer hub.proc.stop()
	if w := e2eStreamInfo(t, hjs, "EDGE").Config.Duplicates; w != 2*time.Minute {
		t.Fatalf("the hub's stream deduplicates over %s after the reload, want the default 2m", w)
	}
	leafPublish(t, ejs, 20, 20)
	wantExactlyOnce(t, hubCounts(t, hjs, 40, 30*time.Second), map[string]uint64{"edge1": 40})
	natstest.CheckFor(t, 10*time.Second, 100*time.Millisecond, func() error {
		if h := edge.get(t, "/healthz"); !strings.Contains(h, `"ok"`) {
			return fmt.Errorf("/healthz after the hub was fixed: %s", h)
		}
		return nil
	})
	if !edge.proc.exited() && strings.Contains(edge.proc.stderr.String(), "level=ERROR msg=\"holdfast") {
		t.Errorf("the edge logged a fatal error:\n%s", edge.proc.stderr.String())
	}
}

// TestLeafSourcesFromHub: a command stream on the hub reaches both edges
// through native stream sources in the hub's domain (one edge sources it,
// the other mirrors it); an edge whose sourced stream cannot take more
// (max_msgs with discard new) reports the source stalled in /healthz,
// status and metrics while the link is up.
func TestLeafSourcesFromHub(t *testing.T) {
	t.Parallel()
	hub := newLeafHub(t, "10m", "\n[streams.COMMANDS]\nsubjects = [\"cmd.>\"]\n")
	hub.start(t)
	hubAddr := fmt.Sprintf("127.0.0.1:%d", hub.leafPort)
	e1 := newLeafEdge(t, "edge1", hubAddr, "\n[streams.CMDS]\nsources = [{ name = \"COMMANDS\", domain = \"hub\" }]\n")
	e2 := newLeafEdge(t, "edge2", hubAddr, "\n[streams.CMDS]\nmirror = { name = \"COMMANDS\", domain = \"hub\" }\nmax_msgs = 2\ndiscard = \"new\"\n")
	e2.inst.cfg = e2eWriteConfig(t, strings.Replace(readFile(t, e2.inst.cfg), "[http]\n", "[http]\nstall_timeout = \"2s\"\n", 1))
	// The forward consumers find no hub stream for edge.<name>.> other
	// than EDGE: that is fine; this test is about the command stream.
	e1.start(t)
	e2.start(t)
	_, hjs := e2eConnect(t, hub.inst)
	ctx := natstest.Context(t)
	for i := range 2 {
		if _, err := hjs.Publish(ctx, "cmd.reboot", []byte(strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	// An edge that creates CMDS before its link carries the hub's API
	// (a loaded machine: the bootstrap ran first) gets no answer to the
	// server's request for a source consumer, and the server waits 30 s
	// before it asks again, link or not (docs/edge-and-hub.md).
	for _, e := range []*leafNode{e1, e2} {
		_, js := e2eConnect(t, e.inst)
		natstest.CheckFor(t, 60*time.Second, 100*time.Millisecond, func() error {
			if si := natstest.StreamInfo(t, js, "CMDS"); si.State.Msgs != 2 {
				return fmt.Errorf("%s CMDS holds %d, want the hub's 2 commands; its sources: %s", e.name, si.State.Msgs, sourcesOf(si))
			}
			return nil
		})
	}
	// edge2's mirror is full: the third command cannot be stored there.
	if _, err := hjs.Publish(natstest.Context(t), "cmd.reboot", []byte("2")); err != nil {
		t.Fatal(err)
	}
	_, js1 := e2eConnect(t, e1.inst)
	natstest.CheckFor(t, 20*time.Second, 100*time.Millisecond, func() error {
		if n := natstest.StreamInfo(t, js1, "CMDS").State.Msgs; n != 3 {
			return fmt.Errorf("edge1 CMDS holds %d, want 3", n)
		}
		return nil
	})
	natstest.CheckFor(t, 30*time.Second, 200*time.Millisecond, func() error {
		if h := e2.get(t, "/healthz"); !strings.Contains(h, "source COMMANDS@$JS.hub.API is stalled") {
			return fmt.Errorf("edge2 healthz: %s\n%s", h, grepLines(e2.get(t, "/metrics"), "holdfast_stream_source"))
		}
		return nil
	})
	if m := e2.get(t, "/metrics"); !strings.Contains(m, `holdfast_stream_source_stalled{source="COMMANDS@$JS.hub.API",stream="CMDS"} 1`) {
		t.Errorf("edge2 metrics:\n%s", grepLines(m, "holdfast_stream_source"))
	}
	if st := runHoldfast(t, nil, "status", "--config", e2.inst.cfg); !strings.Contains(st.stdout, "Source     stream CMDS mirror COMMANDS@$JS.hub.API: lag 1, STALLED") {
		t.Errorf("edge2 status:\n%s", st.stdout)
	}
	if h := e1.get(t, "/healthz"); !strings.Contains(h, `"ok"`) {
		t.Errorf("edge1 healthz: %s", h)
	}
}

// TestLeafHubCluster: the hub is a holdfast cluster of three nodes, each
// with a leafnode listener, and the hub's EDGE stream has three replicas.
// The edge knows one node; the node it is connected to is killed (kill -9)
// in the middle of forwarding: the edge reconnects to another node (the
// hub advertises them), waits while the hub elects leaders, and every
// message arrives once.
func TestLeafHubCluster(t *testing.T) {
	t.Parallel()
	nodes := newTestCluster(t, 3, "")
	leafPorts := make([]int, len(nodes))
	for i, nd := range nodes {
		leafPorts[i] = natstest.FreePort(t)
		text := strings.Replace(readFile(t, nd.cfg), "[jetstream]\n", "[jetstream]\ndomain = \"hub\"\n", 1)
		text += fmt.Sprintf("\n[leafnodes]\nlisten = \"127.0.0.1:%d\"\n\n[streams.EDGE]\nsubjects = [\"edge.>\"]\nduplicate_window = \"10m\"\n", leafPorts[i])
		nd.cfg = e2eWriteConfig(t, text)
		nd.inst.cfg = nd.cfg
	}
	startAll(t, nodes)
	edge := newLeafEdge(t, "edge1", fmt.Sprintf("127.0.0.1:%d", leafPorts[0]), "")
	edge.start(t)
	_, ejs := e2eConnect(t, edge.inst)
	_, hjs := e2eConnect(t, nodes[1].inst)

	leafPublish(t, ejs, 0, 1500)
	hubHoldsAtLeast(t, hjs, 300)
	nodes[0].proc.signal(syscall.SIGKILL)
	killed := time.Now()
	leafPublish(t, ejs, 1500, 500)
	hubHoldsAll(t, hjs, 2000, 90*time.Second)
	t.Logf("all 2000 on the hub cluster %s after the kill -9 of the node the edge was connected to", time.Since(killed).Round(time.Millisecond))
	seen := hubCounts(t, hjs, 2000, 30*time.Second)
	wantExactlyOnce(t, seen, map[string]uint64{"edge1": 2000})
	if n := strings.Count(edge.proc.stderr.String(), "leafnode connected"); n < 2 {
		t.Errorf("the edge connected %d time(s), want a reconnect to another node", n)
	}
}

// TestLeafRemoteURLs: the edge's remote lists two URLs, the first a port
// where nothing listens, the second the hub, which starts only after the
// edge's first attempt failed: trying the URLs in turn, the server tries
// the dead one before it reaches the hub. The edge connects and forwards
// every message once, and /healthz is ok; the link counts as the
// remote's, named by both URLs in the metrics and in status, which also
// shows the address the link is on.
func TestLeafRemoteURLs(t *testing.T) {
	t.Parallel()
	hub := newLeafHub(t, "10m", "")
	hubAddr := fmt.Sprintf("127.0.0.1:%d", hub.leafPort)
	dead := fmt.Sprintf("127.0.0.1:%d", natstest.FreePort(t))
	edge := newLeafEdge(t, "edge1", hubAddr, "")
	text := strings.Replace(readFile(t, edge.inst.cfg), fmt.Sprintf("url = \"nats-leaf://%s\"", hubAddr),
		fmt.Sprintf("urls = [\"nats-leaf://%s\", \"nats-leaf://%s\"]", dead, hubAddr), 1)
	if !strings.Contains(text, "urls = [") {
		t.Fatalf("no urls in the edge's config:\n%s", text)
	}
	edge.inst.cfg = e2eWriteConfig(t, text)
	edge.proc = startHoldfast(t, edge.inst.cfg)
	t.Cleanup(func() {
		if !edge.proc.exited() {
			edge.proc.stop()
		}
	})
	natstest.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if !strings.Contains(edge.proc.stderr.String(), "Error trying to connect as leafnode") {
			return fmt.Errorf("no failed leafnode connect in the edge's log yet")
		}
		return nil
	})
	hub.start(t)
	t.Cleanup(func() {
		if !hub.proc.exited() {
			hub.proc.stop()
		}
	})
	edge.proc.waitReady()
	_, ejs := e2eConnect(t, edge.inst)
	_, hjs := e2eConnect(t, hub.inst)

	leafPublish(t, ejs, 0, 200)
	hubHoldsAll(t, hjs, 200, 15*time.Second)
	wantExactlyOnce(t, hubCounts(t, hjs, 200, 5*time.Second), map[string]uint64{"edge1": 200})

	name := fmt.Sprintf("nats-leaf://%s,nats-leaf://%s", dead, hubAddr)
	natstest.CheckFor(t, 5*time.Second, 100*time.Millisecond, func() error {
		resp, err := http.Get("http://" + edge.httpAddr + "/healthz")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"ok"`) {
			return fmt.Errorf("/healthz %d: %s", resp.StatusCode, body)
		}
		return nil
	})
	if m := edge.get(t, "/metrics"); !strings.Contains(m, `holdfast_leafnode_connected{remote="`+name+`"} 1`) {
		t.Errorf("edge metrics lack the link named %s:\n%s", name, grepLines(m, "holdfast_leafnode_"))
	}
	st := runHoldfast(t, nil, "status", "--config", edge.inst.cfg)
	if want := "Leafnode   " + name + " connected to " + hubAddr; !strings.Contains(st.stdout, want) {
		t.Errorf("edge status lacks %q:\n%s", want, st.stdout)
	}
}

// TestLeafReloadForwardToLog: a reload that gives a forwarding consumer
// another handler drops its forwarder — its hub check and its metrics
// (status and health read the same list) — instead of leaving it
// registered beside the new workers.
func TestLeafReloadForwardToLog(t *testing.T) {
	t.Parallel()
	hub := fmt.Sprintf("127.0.0.1:%d", natstest.FreePort(t)) // nobody listens: the hub is down
	edge := newLeafEdge(t, "edge1", hub, "")
	edge.start(t)
	defer edge.proc.stop()
	const ready = `holdfast_forward_ready{consumer="FORWARD"}`
	if m := edge.get(t, "/metrics"); !strings.Contains(m, ready) {
		t.Fatalf("no %s before the reload:\n%s", ready, grepLines(m, "holdfast_forward_"))
	}
	text := strings.Replace(readFile(t, edge.inst.cfg), `handler = "forward"`, `handler = "log"`, 1)
	edge.proc.reloadWith(edge.inst.cfg, text)
	if m := edge.get(t, "/metrics"); strings.Contains(m, `holdfast_forward_`) {
		t.Errorf("the forwarder is still there after the reload:\n%s", grepLines(m, "holdfast_forward_"))
	}
}

// TestLeafHubClusterTwoRemotes: the same hub cluster failover as
// TestLeafHubCluster, but the edge has a second remote (another hub,
// down). After the kill -9 of the node it names, the first remote's link
// comes back on an address the hub advertised: it must count as that
// remote's link (metrics, forwarding), not as no link at all.
func TestLeafHubClusterTwoRemotes(t *testing.T) {
	t.Parallel()
	nodes := newTestCluster(t, 3, "")
	leafPorts := make([]int, len(nodes))
	for i, nd := range nodes {
		leafPorts[i] = natstest.FreePort(t)
		text := strings.Replace(readFile(t, nd.cfg), "[jetstream]\n", "[jetstream]\ndomain = \"hub\"\n", 1)
		text += fmt.Sprintf("\n[leafnodes]\nlisten = \"127.0.0.1:%d\"\n\n[streams.EDGE]\nsubjects = [\"edge.>\"]\nduplicate_window = \"10m\"\n", leafPorts[i])
		nd.cfg = e2eWriteConfig(t, text)
		nd.inst.cfg = nd.cfg
	}
	startAll(t, nodes)
	other := fmt.Sprintf("127.0.0.1:%d", natstest.FreePort(t)) // another hub, down
	edge := newLeafEdge(t, "edge1", fmt.Sprintf("127.0.0.1:%d", leafPorts[0]),
		fmt.Sprintf("\n[[leafnodes.remotes]]\nurl = \"nats-leaf://%s\"\n", other))
	edge.start(t)
	_, ejs := e2eConnect(t, edge.inst)
	_, hjs := e2eConnect(t, nodes[1].inst)

	first := fmt.Sprintf(`holdfast_leafnode_connected{remote="nats-leaf://127.0.0.1:%d"} 1`, leafPorts[0])
	natstest.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
		if m := edge.get(t, "/metrics"); !strings.Contains(m, first) {
			return fmt.Errorf("no %s:\n%s", first, grepLines(m, "holdfast_leafnode_connected"))
		}
		return nil
	})
	leafPublish(t, ejs, 0, 500)
	hubHoldsAtLeast(t, hjs, 100)
	nodes[0].proc.signal(syscall.SIGKILL)
	// The link is back on another node's address.
	natstest.CheckFor(t, 30*time.Second, 50*time.Millisecond, func() error {
		if n := strings.Count(edge.proc.stderr.String(), "Leafnode connection created"); n < 2 {
			return fmt.Errorf("the edge's server connected %d time(s)", n)
		}
		return nil
	})
	leafPublish(t, ejs, 500, 500)
	hubHoldsAll(t, hjs, 1000, 60*time.Second)
	seen := hubCounts(t, hjs, 1000, 30*time.Second)
	wantExactlyOnce(t, seen, map[string]uint64{"edge1": 1000})
	m := edge.get(t, "/metrics")
	if !strings.Contains(m, first) {
		t.Errorf("the first remote's link is up on another node, but:\n%s", grepLines(m, "holdfast_leafnode_connected"))
	}
	down := fmt.Sprintf(`holdfast_leafnode_connected{remote="nats-leaf://%s"} 0`, other)
	if !strings.Contains(m, down) {
		t.Errorf("the second remote is down, but:\n%s", grepLines(m, "holdfast_leafnode_connected"))
	}
}

// TestLeafForwardWaitsForItsHub: an edge with two remotes, its forward
// hub (domain "hub") down and another hub (domain "hub2") up whose stream
// also takes edge.>. The link to hub2 is no link to the forward's hub:
// forwarding waits for its link (ready 0, no "does not forward" in
// /healthz). Once the hub is up, a publish would reach both hubs' streams:
// forwarding waits and /healthz names hub2's stream, nothing is stored on
// either or dead-lettered; once hub2's stream is gone, every message
// reaches the hub once.
func TestLeafForwardWaitsForItsHub(t *testing.T) {
	t.Parallel()
	hub := newLeafHub(t, "10m", "")
	hub2 := newLeafHub(t, "10m", "")
	text := strings.Replace(readFile(t, hub2.inst.cfg), `domain = "hub"`, `domain = "hub2"`, 1)
	text = strings.Replace(text, `name = "hub"`, `name = "hub2"`, 1)
	hub2.inst.cfg = e2eWriteConfig(t, text)
	hub2.start(t)
	defer hub2.proc.stop()
	edge := newLeafEdge(t, "edge1", fmt.Sprintf("127.0.0.1:%d", hub.leafPort),
		fmt.Sprintf("\n[[leafnodes.remotes]]\nurl = \"nats-leaf://127.0.0.1:%d\"\n", hub2.leafPort))
	edge.start(t)
	defer edge.proc.stop()
	natstest.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
		want := fmt.Sprintf(`holdfast_leafnode_connected{remote="nats-leaf://127.0.0.1:%d"} 1`, hub2.leafPort)
		if m := edge.get(t, "/metrics"); !strings.Contains(m, want) {
			return fmt.Errorf("no %s", want)
		}
		return nil
	})
	_, ejs := e2eConnect(t, edge.inst)
	leafPublish(t, ejs, 0, 100)
	time.Sleep(2 * time.Second) // the forwarder's hub check runs every second
	if h := edge.get(t, "/healthz"); strings.Contains(h, "does not forward") {
		t.Errorf("the forward hub is down, not failing: /healthz says\n%s", h)
	}
	if m := edge.get(t, "/metrics"); !strings.Contains(m, `holdfast_forward_ready{consumer="FORWARD"} 0`) {
		t.Errorf("forwarding ready without its hub:\n%s", grepLines(m, "holdfast_forward_ready"))
	}

	hub.start(t)
	defer hub.proc.stop()
	_, hjs := e2eConnect(t, hub.inst)
	_, h2js := e2eConnect(t, hub2.inst)
	natstest.CheckFor(t, 15*time.Second, 100*time.Millisecond, func() error {
		if h := edge.get(t, "/healthz"); !strings.Contains(h, `stream EDGE of JetStream domain \"hub2\"`) {
			return fmt.Errorf("/healthz does not name hub2's stream:\n%s", h)
		}
		return nil
	})
	time.Sleep(time.Second)
	for name, js := range map[string]jetstream.JetStream{"hub": hjs, "hub2": h2js} {
		if n := natstest.StreamInfo(t, js, "EDGE").State.Msgs; n != 0 {
			t.Errorf("%s stored %d forwarded messages while both hubs take them", name, n)
		}
	}
	if n := natstest.StreamInfo(t, ejs, "ORDERS_DLQ").State.Msgs; n != 0 {
		t.Errorf("%d messages dead-lettered", n)
	}

	if err := h2js.DeleteStream(natstest.Context(t), "EDGE"); err != nil {
		t.Fatal(err)
	}
	seen := hubCounts(t, hjs, 100, 30*time.Second)
	wantExactlyOnce(t, seen, map[string]uint64{"edge1": 100})
	if n := natstest.StreamInfo(t, ejs, "ORDERS_DLQ").State.Msgs; n != 0 {
		t.Errorf("%d messages dead-lettered", n)
	}
}

// TestLeafHubRestartedWithShortWindow: the hub comes back from a restart
// with a duplicate window shorter than twice the edge's forward.timeout.
// The edge checks the hub's stream again after the link comes back, so it
// stops forwarding and says why, instead of forwarding with no protection
// for a publish still on its way while it is sent again.
func TestLeafHubRestartedWithShortWindow(t *testing.T) {
	t.Parallel()
	hub := newLeafHub(t, "10m", "")
	hub.start(t)
	edge := newLeafEdge(t, "edge1", fmt.Sprintf("127.0.0.1:%d", hub.leafPort), "")
	edge.start(t)
	defer edge.proc.stop()
	_, ejs := e2eConnect(t, edge.inst)
	_, hjs := e2eConnect(t, hub.inst)
	leafPublish(t, ejs, 0, 50)
	hubCounts(t, hjs, 50, 30*time.Second)

	hub.proc.stop()
	hub.inst.cfg = e2eWriteConfig(t, strings.Replace(readFile(t, hub.inst.cfg), `duplicate_window = "10m"`, `duplicate_window = "10s"`, 1))
	hub.start(t)
	defer hub.proc.stop()
	_, hjs = e2eConnect(t, hub.inst)
	if w := e2eStreamInfo(t, hjs, "EDGE").Config.Duplicates; w != 10*time.Second {
		t.Fatalf("the hub's stream deduplicates over %s after the restart, want 10s", w)
	}
	natstest.CheckFor(t, 15*time.Second, 100*time.Millisecond, func() error {
		if h := edge.get(t, "/healthz"); !strings.Contains(h, "duplicate window is too short") {
			return fmt.Errorf("/healthz says nothing of the window:\n%s", h)
		}
		return nil
	})
	leafPublish(t, ejs, 50, 50)
	time.Sleep(2 * time.Second)
	if n := natstest.StreamInfo(t, hjs, "EDGE").State.Msgs; n != 50 {
		t.Errorf("the hub holds %d: the edge forwarded to a stream whose window is too short", n)
	}
}

func e2eStreamInfo(t *testing.T, js jetstream.JetStream, name string) *jetstream.StreamInfo {
	t.Helper()
	s, err := js.Stream(natstest.Context(t), name)
	if err != nil {
		t.Fatal(err)
	}
	return s.CachedInfo()
}

// TestLeafEdgesWithTheSameName: two edges with the same server.name. The
// hub keeps one leafnode connection per server name and account, so each
// edge's link drops the other's, over and over; each edge says so in
// /healthz, naming server.name, instead of "ok".
func TestLeafEdgesWithTheSameName(t *testing.T) {
	t.Parallel()
	hub := newLeafHub(t, "10m", "")
	hub.start(t)
	defer hub.proc.stop()
	addr := fmt.Sprintf("127.0.0.1:%d", hub.leafPort)
	edges := []*leafNode{newLeafEdge(t, "edge1", addr, ""), newLeafEdge(t, "edge1", addr, "")}
	for _, e := range edges {
		e.start(t)
		defer e.proc.stop()
	}
	for i, e := range edges {
		natstest.CheckFor(t, 20*time.Second, 200*time.Millisecond, func() error {
			h := e.get(t, "/healthz")
			if !strings.Contains(h, "drops this link as a duplicate") || !strings.Contains(h, `server.name \"edge1\"`) {
				return fmt.Errorf("edge %d /healthz:\n%s", i, h)
			}
			return nil
		})
	}
}

// TestLeafHubGroupCommit: the hub's EDGE stream has group_commit = true
// (it listens on $HOLDFAST.GC.EDGE.edge.> and the hub answers edge.>
// itself). The edge's hub check finds it there, and every message reaches
// it once, under its edge.<name>.… subject.
func TestLeafHubGroupCommit(t *testing.T) {
	t.Parallel()
	_, edge, hjs, ejs := startLeafPair(t, "10m", "group_commit = true\n", "")
	leafPublish(t, ejs, 0, 300)
	seen := hubCounts(t, hjs, 300, 30*time.Second)
	wantExactlyOnce(t, seen, map[string]uint64{"edge1": 300})
	if h := edge.get(t, "/healthz"); !strings.Contains(h, `"ok"`) {
		t.Errorf("edge /healthz: %s", h)
	}
}

// hubHoldsAtLeast waits up to 30 s until the hub's stream EDGE holds at
// least n messages, polling often: the tests use it to strike in the
// middle of forwarding.
func hubHoldsAtLeast(t *testing.T, hjs jetstream.JetStream, n uint64) {
	t.Helper()
	natstest.CheckFor(t, 30*time.Second, 5*time.Millisecond, func() error {
		if got := natstest.StreamInfo(t, hjs, "EDGE").State.Msgs; got < n {
			return fmt.Errorf("hub holds %d, waiting for %d", got, n)
		}
		return nil
	})
}

// hubHoldsAll waits up to within until the hub's stream EDGE holds exactly
// n messages. A hub cluster's stream may not answer while its Raft group
// elects a leader: it asks with short timeouts, an error is a retry.
func hubHoldsAll(t *testing.T, hjs jetstream.JetStream, n uint64, within time.Duration) {
	t.Helper()
	natstest.CheckFor(t, within, 500*time.Millisecond, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		s, err := hjs.Stream(ctx, "EDGE")
		if err != nil {
			return err
		}
		if got := s.CachedInfo().State.Msgs; got != n {
			return fmt.Errorf("hub holds %d, want %d", got, n)
		}
		return nil
	})
}

// TestLeafEdgeRestoredFromOlderBackup: an edge's store directory is put
// back from a copy taken before its last messages were forwarded (README:
// "put the directory back from a backup"). The stream keeps its creation
// time and continues the copy's sequences, so new messages get the
// sequences of messages the hub already holds: each must still be stored
// on the hub (its id names when the edge stored it), not dropped as a
// duplicate of the old one while the edge acks it.
func TestLeafEdgeRestoredFromOlderBackup(t *testing.T) {
	t.Parallel()
	hub := newLeafHub(t, "10m", "")
	hub.start(t)
	defer hub.proc.stop()
	edge := newLeafEdge(t, "edge1", fmt.Sprintf("127.0.0.1:%d", hub.leafPort), "")
	edge.start(t)
	_, ejs := e2eConnect(t, edge.inst)
	_, hjs := e2eConnect(t, hub.inst)
	leafPublish(t, ejs, 0, 20)
	hubCounts(t, hjs, 20, 30*time.Second)
	natstest.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
		if ci := natstest.ConsumerInfo(t, ejs, "ORDERS", "FORWARD"); ci.AckFloor.Stream != 20 {
			return fmt.Errorf("FORWARD ack floor %d, want 20", ci.AckFloor.Stream)
		}
		return nil
	})
	created := natstest.StreamInfo(t, ejs, "ORDERS").Created
	edge.proc.stop()
	backup := filepath.Join(t.TempDir(), "store")
	if err := os.CopyFS(backup, os.DirFS(edge.inst.store)); err != nil {
		t.Fatal(err)
	}
	edge.start(t)
	_, ejs = e2eConnect(t, edge.inst)
	leafPublish(t, ejs, 20, 30)
	hubCounts(t, hjs, 50, 30*time.Second)

	edge.proc.stop()
	if err := os.RemoveAll(edge.inst.store); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(backup, edge.inst.store); err != nil {
		t.Fatal(err)
	}
	edge.start(t)
	defer edge.proc.stop()
	_, ejs = e2eConnect(t, edge.inst)
	if si := natstest.StreamInfo(t, ejs, "ORDERS"); si.State.LastSeq != 20 || !si.Created.Equal(created) {
		t.Fatalf("restored ORDERS ends at seq %d, created %s: want the copy's 20 and %s", si.State.LastSeq, si.Created, created)
	}
	leafPublish(t, ejs, 50, 30) // sequences 21..50 again, other messages
	seen := hubCounts(t, hjs, 80, 30*time.Second)
	for seq := uint64(1); seq <= 50; seq++ {
		want := 1
		if seq > 20 {
			want = 2 // forwarded before the restore, and its successor after
		}
		if c := seen["edge1"][seq]; c != want {
			t.Errorf("origin seq %d stored %d times on the hub, want %d", seq, c, want)
		}
	}
}

// TestLeafEdgeRestoredResendsDeduplicated: `holdfast restore` of an edge's
// stream from a backup taken while messages waited for the hub, the common
// way after a disk loss (restore, then restart). The restore gives the
// stream a new creation time, later than its messages; the restored forward
// consumer sends the messages again, already on the hub by then. Each is
// forwarded (not retried as belonging to a stream since deleted) and, within
// the hub's duplicate window, stored once: the forwarded id names the
// message's sequence and stored time, which the restore keeps.
func TestLeafEdgeRestoredResendsDeduplicated(t *testing.T) {
	t.Parallel()
	hub := newLeafHub(t, "10m", "")
	hub.start(t)
	edge := newLeafEdge(t, "edge1", fmt.Sprintf("127.0.0.1:%d", hub.leafPort), "")
	edge.start(t)
	_, ejs := e2eConnect(t, edge.inst)
	_, hjs := e2eConnect(t, hub.inst)
	leafPublish(t, ejs, 0, 10)
	hubCounts(t, hjs, 10, 30*time.Second)

	hub.proc.stop()
	leafPublish(t, ejs, 10, 20) // sequences 11..30 wait for the hub
	dir := filepath.Join(t.TempDir(), "backup")
	if res := runHoldfast(t, nil, "backup", "--config", edge.inst.cfg, "--stream", "ORDERS", dir); res.code != 0 {
		t.Fatalf("backup: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	hub.start(t)
	hubCounts(t, leafConnect(t, hub, ""), 30, 30*time.Second)
	forwarded := func() error {
		if ci := natstest.ConsumerInfo(t, ejs, "ORDERS", "FORWARD"); ci.AckFloor.Stream != 30 || ci.NumAckPending != 0 {
			return fmt.Errorf("FORWARD ack floor %d, ack pending %d", ci.AckFloor.Stream, ci.NumAckPending)
		}
		return nil
	}
	natstest.CheckFor(t, 30*time.Second, 50*time.Millisecond, forwarded)

	hub.proc.stop()
	if res := runHoldfast(t, nil, "restore", "--config", edge.inst.cfg, "--replace", dir); res.code != 0 {
		t.Fatalf("restore: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	if ci := natstest.ConsumerInfo(t, ejs, "ORDERS", "FORWARD"); ci.AckFloor.Stream != 10 {
		t.Fatalf("restored FORWARD ack floor %d, want the backup's 10", ci.AckFloor.Stream)
	}
	edge.proc.stop()
	edge.start(t)
	defer edge.proc.stop()
	hub.start(t)
	defer hub.proc.stop()
	_, ejs = e2eConnect(t, edge.inst)
	_, hjs = e2eConnect(t, hub.inst)
	natstest.CheckFor(t, 30*time.Second, 50*time.Millisecond, forwarded)
	wantExactlyOnce(t, hubCounts(t, hjs, 30, 30*time.Second), map[string]uint64{"edge1": 30})
	if n := natstest.StreamInfo(t, ejs, "ORDERS_DLQ").State.Msgs; n != 0 {
		t.Errorf("%d dead letters on the edge", n)
	}
}

// TestLeafLargestMessageReachesHub: hub and edge with the same
// server.max_payload (the default, 1MiB), as the README asks ("a hub
// max_payload at least the edges'"). A message the edge stored, of the
// largest size its stream takes, must reach the hub, although forwarding
// adds the origin headers to it; it must not be dead-lettered on the edge
// as larger than the hub stream's max_msg_size. After an edge restart,
// with that message the last on the hub, forwarding goes on.
func TestLeafLargestMessageReachesHub(t *testing.T) {
	t.Parallel()
	_, edge, hjs, ejs := startLeafPair(t, "10m", "", "")
	ctx := natstest.Context(t)
	if _, err := ejs.Publish(ctx, "orders.created", []byte("before")); err != nil {
		t.Fatal(err)
	}
	m := nats.NewMsg("orders.created")
	m.Header.Set("Trace", "t-1")
	m.Data = make([]byte, 1<<20-len("Trace: t-1")-20)
	if _, err := ejs.PublishMsg(ctx, m); err != nil {
		t.Fatalf("edge refused the message: %v", err)
	}
	hubHolds := func(want uint64) {
		t.Helper()
		natstest.CheckFor(t, 30*time.Second, 200*time.Millisecond, func() error {
			if got := natstest.StreamInfo(t, hjs, "EDGE").State.Msgs; got != want {
				return fmt.Errorf("hub holds %d, want %d; edge status:\n%s", got, want, edge.get(t, "/healthz"))
			}
			return nil
		})
	}
	hubHolds(2)
	hs, err := hjs.Stream(ctx, "EDGE")
	if err != nil {
		t.Fatal(err)
	}
	got, err := hs.GetMsg(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Data) != len(m.Data) || got.Header.Get("Trace") != "t-1" {
		t.Fatalf("hub holds %d bytes, Trace %q", len(got.Data), got.Header.Get("Trace"))
	}
	// The edge reads its position at start: the large message, the last
	// on its subject. Read base64-encoded, it broke the edge's max_payload
	// and the leafnode link, again at each reconnect.
	edge.proc.stop()
	edge.start(t)
	_, ejs = e2eConnect(t, edge.inst)
	if _, err := ejs.Publish(ctx, "orders.created", []byte("after")); err != nil {
		t.Fatal(err)
	}
	hubHolds(3)
}

// TestLeafHubStreamFull: the hub's stream is full with discard = "new"
// (it refuses new messages until space is made). The edge's messages wait
// for it, spending no deliveries (the hub's stream explains the failure),
// /healthz names the cause, and once space is made every message reaches
// the hub once; none is dead-lettered on the edge.
func TestLeafHubStreamFull(t *testing.T) {
	t.Parallel()
	_, edge, hjs, ejs := startLeafPair(t, "10m", "max_msgs = 5\ndiscard = \"new\"\n", "max_deliver = 3\n")
	leafPublish(t, ejs, 0, 10)
	hubHoldsAll(t, hjs, 5, 30*time.Second)
	natstest.CheckFor(t, 20*time.Second, 200*time.Millisecond, func() error {
		if h := edge.get(t, "/healthz"); !strings.Contains(h, "maximum messages exceeded") {
			return fmt.Errorf("edge /healthz does not name the full hub stream:\n%s", h)
		}
		return nil
	})
	time.Sleep(2 * time.Second) // deliveries would be spent meanwhile
	ctx := natstest.Context(t)
	if s, err := ejs.Stream(ctx, "ORDERS_DLQ"); err == nil {
		if n := s.CachedInfo().State.Msgs; n != 0 {
			t.Fatalf("the edge dead-lettered %d message(s) while the hub's stream was full", n)
		}
	}
	hs, err := hjs.Stream(ctx, "EDGE")
	if err != nil {
		t.Fatal(err)
	}
	if err := hs.Purge(ctx); err != nil {
		t.Fatal(err)
	}
	hubHoldsAll(t, hjs, 5, 30*time.Second)
	seen := hubCounts(t, hjs, 5, 10*time.Second)
	for seq := uint64(6); seq <= 10; seq++ {
		if seen["edge1"][seq] != 1 {
			t.Errorf("edge1 seq %d stored %d times after the purge", seq, seen["edge1"][seq])
		}
	}
	natstest.CheckFor(t, 10*time.Second, 200*time.Millisecond, func() error {
		if h := edge.get(t, "/healthz"); !strings.Contains(h, `"ok"`) {
			return fmt.Errorf("edge /healthz: %s", h)
		}
		return nil
	})
}

// TestLeafSplitHubStreamsOversize: the hub splits the edges' messages over
// two streams (EDGE on edge.*.orders.created, EDGE2 on
// edge.*.orders.paid) and has a smaller max_payload than the edge. A
// message larger than both streams take is dead-lettered on the edge with
// the reason; sent, it would make the hub close the leafnode link
// (Maximum Payload Violation) at each reconnect, and nothing behind it
// would be forwarded.
func TestLeafSplitHubStreamsOversize(t *testing.T) {
	t.Parallel()
	hub := newLeafHub(t, "10m", "")
	text := strings.Replace(readFile(t, hub.inst.cfg), "port = ", "max_payload = \"2KB\"\nport = ", 1)
	text = strings.Replace(text, `subjects = ["edge.>"]`, `subjects = ["edge.*.orders.created"]`, 1)
	text += "\n[streams.EDGE2]\nsubjects = [\"edge.*.orders.paid\"]\nduplicate_window = \"10m\"\n"
	if err := os.WriteFile(hub.inst.cfg, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	hub.start(t)
	defer hub.proc.stop()
	edge := newLeafEdge(t, "edge1", fmt.Sprintf("127.0.0.1:%d", hub.leafPort), "")
	edge.start(t)
	defer edge.proc.stop()
	_, ejs := e2eConnect(t, edge.inst)
	_, hjs := e2eConnect(t, hub.inst)
	ctx := natstest.Context(t)
	if _, err := ejs.Publish(ctx, "orders.created", make([]byte, 12000)); err != nil {
		t.Fatal(err)
	}
	if _, err := ejs.Publish(ctx, "orders.created", []byte("small")); err != nil {
		t.Fatal(err)
	}
	natstest.CheckFor(t, 20*time.Second, 200*time.Millisecond, func() error {
		if got := natstest.StreamInfo(t, hjs, "EDGE").State.Msgs; got != 1 {
			return fmt.Errorf("hub holds %d, want 1; edge /healthz:\n%s", got, edge.get(t, "/healthz"))
		}
		return nil
	})
	dl, err := ejs.Stream(ctx, "ORDERS_DLQ")
	if err != nil {
		t.Fatal(err)
	}
	m, err := dl.GetLastMsgForSubject(ctx, "dlq.FORWARD.orders.created")
	if err != nil {
		t.Fatalf("no dead letter for the oversized message: %v", err)
	}
	if reason := m.Header.Get("Holdfast-Error"); !strings.Contains(reason, "max_msg_size") {
		t.Errorf("dead letter reason %q does not name the hub's limit", reason)
	}
}

// TestLeafHubClosesLinkForOversize: the hub has a smaller max_payload than
// the edge, and the stream that takes the edge's messages (created by hand,
// not by holdfast) sets no max_msg_size, so the edge cannot know the limit.
// The hub closes the link for a message over it, again after each
// reconnect, and nothing behind it moves: the edge's /healthz must say so,
// naming the hub's max_payload, instead of "ok".
func TestLeafHubClosesLinkForOversize(t *testing.T) {
	t.Parallel()
	hub := newLeafHub(t, "10m", "")
	text := strings.Replace(readFile(t, hub.inst.cfg), "port = ", "max_payload = \"2KB\"\nport = ", 1)
	text = strings.Replace(text, `subjects = ["edge.>"]`, `subjects = ["edge.other.>"]`, 1)
	if err := os.WriteFile(hub.inst.cfg, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	hub.start(t)
	defer hub.proc.stop()
	_, hjs := e2eConnect(t, hub.inst)
	ctx := natstest.Context(t)
	if _, err := hjs.CreateStream(ctx, jetstream.StreamConfig{Name: "BYHAND", Subjects: []string{"edge.edge1.>"}, Duplicates: 10 * time.Minute, MaxMsgSize: -1}); err != nil {
		t.Fatal(err)
	}
	edge := newLeafEdge(t, "edge1", fmt.Sprintf("127.0.0.1:%d", hub.leafPort), "")
	edge.start(t)
	defer edge.proc.stop()
	_, ejs := e2eConnect(t, edge.inst)
	if _, err := ejs.Publish(ctx, "orders.created", make([]byte, 12000)); err != nil {
		t.Fatal(err)
	}
	natstest.CheckFor(t, 20*time.Second, 200*time.Millisecond, func() error {
		if h := edge.get(t, "/healthz"); !strings.Contains(h, "larger than its max_payload") {
			return fmt.Errorf("edge /healthz does not name the hub's max_payload:\n%s", h)
		}
		return nil
	})
}

// TestLeafHubStreamRecreatedKeepsOrder: the hub's stream is deleted in the
// middle of forwarding and created again 3 s later. The publish in flight
// gets no PubAck (the hub swallows it with its stream) and times out once
// the stream is back; it must be sent again in its place, not handed back
// for a later delivery behind the messages after it. The new stream has
// lost what the old one acknowledged: the edge sends that again first, so
// the new stream holds every origin sequence, in order, each once, and
// nothing is dead-lettered.
func TestLeafHubStreamRecreatedKeepsOrder(t *testing.T) {
	t.Parallel()
	_, edge, hjs, ejs := startLeafPair(t, "10m", "", "")
	ctx := natstest.Context(t)
	const n = 1500
	leafPublish(t, ejs, 0, 500)
	hubHoldsAtLeast(t, hjs, 200)
	cfg := natstest.StreamInfo(t, hjs, "EDGE").Config
	if err := hjs.DeleteStream(ctx, "EDGE"); err != nil {
		t.Fatal(err)
	}
	// Publishing goes on while the hub has no stream (batches forward the
	// first 500 fast: they may all be on the hub before the delete).
	for i := 500; i < n; i += 100 {
		leafPublish(t, ejs, i, 100)
		time.Sleep(300 * time.Millisecond)
	}
	if _, err := hjs.CreateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	natstest.CheckFor(t, 60*time.Second, 500*time.Millisecond, func() error {
		if got := natstest.StreamInfo(t, hjs, "EDGE").State.Msgs; got < n {
			return fmt.Errorf("the new stream holds %d of %d; edge %s", got, n,
				grepLines(edge.get(t, "/metrics"), "holdfast_forward_backlog_messages"))
		}
		if m := edge.get(t, "/metrics"); !strings.Contains(m, `holdfast_forward_backlog_messages{consumer="FORWARD"} 0`) {
			return fmt.Errorf("backlog")
		}
		return nil
	})
	info := natstest.StreamInfo(t, hjs, "EDGE")
	c, err := hjs.OrderedConsumer(ctx, "EDGE", jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	var seqs []uint64
	for uint64(len(seqs)) < info.State.Msgs {
		b, err := c.Fetch(500, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for m := range b.Messages() {
			s, _ := strconv.ParseUint(m.Headers().Get("Holdfast-Origin-Seq"), 10, 64)
			seqs = append(seqs, s)
		}
	}
	t.Logf("the new stream holds origin sequences %d..%d (%d); edge: %s", seqs[0], seqs[len(seqs)-1], len(seqs),
		grepLines(edge.get(t, "/metrics"), "holdfast_forward_errors_total"))
	for i, s := range seqs {
		if s != seqs[0]+uint64(i) {
			t.Fatalf("the new stream's message %d has origin sequence %d, want %d (out of order, or missing)", i, s, seqs[0]+uint64(i))
		}
	}
	if seqs[0] != 1 || seqs[len(seqs)-1] != n {
		t.Fatalf("the new stream holds origin sequences %d..%d, want 1..%d: what the deleted stream had acknowledged is to be sent again", seqs[0], seqs[len(seqs)-1], n)
	}
	if s, err := ejs.Stream(ctx, "ORDERS_DLQ"); err == nil && s.CachedInfo().State.Msgs != 0 {
		t.Fatalf("the edge dead-lettered %d message(s)", s.CachedInfo().State.Msgs)
	}
}

// TestLeafPasswordRevokedNamedInHealth: the hub is restarted with another
// leafnode password. The edge's link is refused at each reconnect and its
// messages wait; /healthz must name the refused credentials at once, not
// say "ok" until unreachable_after (5 minutes) has passed.
func TestLeafPasswordRevokedNamedInHealth(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	pw := dir + "/leaf.pw"
	if err := os.WriteFile(pw, []byte("first-password-123\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	epw := dir + "/edge.pw"
	if err := os.WriteFile(epw, []byte("first-password-123\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	hub := newLeafHub(t, "10m", "")
	text := strings.Replace(readFile(t, hub.inst.cfg), "no_advertise = true", fmt.Sprintf("no_advertise = true\nuser = \"leaf\"\npassword_file = %q", pw), 1)
	if err := os.WriteFile(hub.inst.cfg, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	hub.start(t)
	edge := newLeafEdge(t, "edge1", fmt.Sprintf("127.0.0.1:%d", hub.leafPort), "")
	text = strings.Replace(readFile(t, edge.inst.cfg), "[streams.ORDERS]", fmt.Sprintf("user = \"leaf\"\npassword_file = %q\n\n[streams.ORDERS]", epw), 1)
	if err := os.WriteFile(edge.inst.cfg, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	edge.start(t)
	defer edge.proc.stop()
	_, ejs := e2eConnect(t, edge.inst)
	_, hjs := e2eConnect(t, hub.inst)
	leafPublish(t, ejs, 0, 50)
	hubHoldsAll(t, hjs, 50, 20*time.Second)
	hub.proc.stop()
	if err := os.WriteFile(pw, []byte("second-password-456\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	hub.start(t)
	defer hub.proc.stop()
	leafPublish(t, ejs, 50, 50)
	natstest.CheckFor(t, 20*time.Second, 200*time.Millisecond, func() error {
		if h := edge.get(t, "/healthz"); !strings.Contains(h, "refuses this edge's leafnode credentials") {
			return fmt.Errorf("edge /healthz does not name the refused credentials:\n%s", h)
		}
		return nil
	})
}

// TestLeafLinkRefusedFromStartNamedInHealth: an edge whose link to the
// hub never comes up because the two disagree — a ca_file that did not
// sign the hub's certificate, TLS on the edge against a hub without it,
// no client certificate for a hub with leafnodes.verify (the edge sees
// only a read error right after each connect), a leafnode password the
// hub refuses. Every reconnect fails the same way
// and waiting does not heal it: the edge's /healthz must name the cause
// at once, not say "ok" until unreachable_after (5 minutes).
func TestLeafLinkRefusedFromStartNamedInHealth(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	certs, err := testcert.Write(dir)
	if err != nil {
		t.Fatal(err)
	}
	hubPw, edgePw := filepath.Join(dir, "hub.pw"), filepath.Join(dir, "edge.pw")
	if err := os.WriteFile(hubPw, []byte("right-password-123\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(edgePw, []byte("wrong-password-456\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	hubTLS := fmt.Sprintf("cert_file = %q\nkey_file = %q\n", certs.ServerCert, certs.ServerKey)
	for _, c := range []struct{ name, hub, remote, want string }{
		{"CA that did not sign the hub's certificate", hubTLS, fmt.Sprintf("ca_file = %q\n", certs.OtherCA), "TLS handshake with the hub fails (tls: failed to verify certificate: x509: certificate signed by unknown authority"},
		{"TLS on the edge only", "", fmt.Sprintf("ca_file = %q\n", certs.CA), "TLS handshake with the hub fails"},
		{"no client certificate for a hub that verifies", hubTLS + fmt.Sprintf("ca_file = %q\nverify = true\n", certs.CA), fmt.Sprintf("ca_file = %q\n", certs.CA), "give this remote cert_file and key_file"},
		{"wrong password", fmt.Sprintf("user = \"leaf\"\npassword_file = %q\n", hubPw), fmt.Sprintf("user = \"leaf\"\npassword_file = %q\n", edgePw), "refuses this edge's leafnode credentials"},
	} {
		hub := newLeafHub(t, "10m", "")
		hub.inst.cfg = e2eWriteConfig(t, strings.Replace(readFile(t, hub.inst.cfg), "no_advertise = true\n", "no_advertise = true\n"+c.hub, 1))
		hub.start(t)
		edge := newLeafEdge(t, "edge1", fmt.Sprintf("127.0.0.1:%d", hub.leafPort), "")
		edge.inst.cfg = e2eWriteConfig(t, strings.Replace(readFile(t, edge.inst.cfg), "[streams.ORDERS]", c.remote+"\n[streams.ORDERS]", 1))
		edge.start(t)
		natstest.CheckFor(t, 20*time.Second, 200*time.Millisecond, func() error {
			if h := edge.get(t, "/healthz"); !strings.Contains(h, `"degraded"`) || !strings.Contains(h, c.want) {
				return fmt.Errorf("%s: edge /healthz does not name the cause (%q):\n%s", c.name, c.want, h)
			}
			return nil
		})
		edge.proc.stop()
		hub.proc.stop()
	}
}

// TestLeafForwardDomainNoHubServes: the edge's link is up, but the hub
// behind it serves another JetStream domain than forward.domain (a typo,
// or the hub's jetstream.domain changed). Nothing can be forwarded and
// waiting does not heal it: /healthz and `holdfast status` must name the
// domain and what the hub serves, not say "ok" and "waiting for the link"
// while the backlog grows.
func TestLeafForwardDomainNoHubServes(t *testing.T) {
	t.Parallel()
	hub := newLeafHub(t, "10m", "")
	hub.start(t)
	defer hub.proc.stop()
	edge := newLeafEdge(t, "edge1", fmt.Sprintf("127.0.0.1:%d", hub.leafPort), "[consumers.FORWARD.forward]\ndomain = \"hbu\"\n")
	edge.start(t)
	defer edge.proc.stop()
	const want = `no hub connected over the leafnode links serves JetStream domain \"hbu\"`
	natstest.CheckFor(t, 20*time.Second, 200*time.Millisecond, func() error {
		if h := edge.get(t, "/healthz"); !strings.Contains(h, `"degraded"`) || !strings.Contains(h, want) || !strings.Contains(h, `serve \"hub\"`) {
			return fmt.Errorf("edge /healthz does not name the forward domain no hub serves:\n%s", h)
		}
		return nil
	})
	if st := runHoldfast(t, nil, "status", "--config", edge.inst.cfg); !strings.Contains(st.stdout, `WAITING: no hub connected over the leafnode links serves JetStream domain "hbu"`) {
		t.Errorf("edge status:\n%s", st.stdout)
	}
}

// TestLeafEdgesAcksStayLocal: two edges with the same stream and forward
// consumer (ORDERS, FORWARD: the README's config for every edge). A
// consumer's acks go to $JS.ACK.<stream>.<consumer>..., which nats-server
// carries over leafnode links whatever the deny lists say, so one edge's
// acks also acked the other edge's message of the same sequence that was
// waiting for its hub: a restart then never forwarded it. Here edge2's
// hub stream is full while edge1 forwards; edge2 is restarted after room
// is made: each of its messages must reach the hub.
func TestLeafEdgesAcksStayLocal(t *testing.T) {
	t.Parallel()
	hub := newLeafHub(t, "10m", "\n[streams.EDGE2]\nsubjects = [\"edge.edge2.>\"]\nduplicate_window = \"10m\"\nmax_msgs = 1\ndiscard = \"new\"\n")
	hub.inst.cfg = e2eWriteConfig(t, strings.Replace(readFile(t, hub.inst.cfg), `subjects = ["edge.>"]`, `subjects = ["edge.edge1.>"]`, 1))
	hub.start(t)
	defer hub.proc.stop()
	addr := fmt.Sprintf("127.0.0.1:%d", hub.leafPort)
	e1, e2 := newLeafEdge(t, "edge1", addr, ""), newLeafEdge(t, "edge2", addr, "")
	e1.start(t)
	defer e1.proc.stop()
	e2.start(t)
	defer func() {
		if !e2.proc.exited() {
			e2.proc.stop()
		}
	}()
	_, j1 := e2eConnect(t, e1.inst)
	_, j2 := e2eConnect(t, e2.inst)
	_, hjs := e2eConnect(t, hub.inst)
	ctx := natstest.Context(t)

	leafPublish(t, j2, 0, 11) // seq 1 fills EDGE2, 2..11 wait for room
	natstest.CheckFor(t, 20*time.Second, 100*time.Millisecond, func() error {
		if h := e2.get(t, "/healthz"); !strings.Contains(h, "maximum messages exceeded") {
			return fmt.Errorf("edge2 does not wait for its full hub stream: %s", h)
		}
		return nil
	})
	leafPublish(t, j1, 0, 11) // forwarded and acked on edge1
	hubHoldsAll(t, hjs, 11, 30*time.Second)
	natstest.CheckFor(t, 10*time.Second, 100*time.Millisecond, func() error {
		if ci := natstest.ConsumerInfo(t, j1, "ORDERS", "FORWARD"); ci.AckFloor.Stream != 11 {
			return fmt.Errorf("edge1 FORWARD ack floor %d", ci.AckFloor.Stream)
		}
		return nil
	})
	time.Sleep(500 * time.Millisecond) // edge1's acks would reach edge2 by now
	if ci := natstest.ConsumerInfo(t, j2, "ORDERS", "FORWARD"); ci.AckFloor.Stream != 1 {
		t.Errorf("edge2 FORWARD ack floor %d, want 1: edge1's acks acked edge2's messages", ci.AckFloor.Stream)
	}

	e2.proc.stop()
	si := natstest.StreamInfo(t, hjs, "EDGE2")
	si.Config.MaxMsgs = -1
	if _, err := hjs.UpdateStream(ctx, si.Config); err != nil {
		t.Fatal(err)
	}
	e2.start(t)
	natstest.CheckFor(t, 30*time.Second, 200*time.Millisecond, func() error {
		if n := natstest.StreamInfo(t, hjs, "EDGE2").State.Msgs; n != 11 {
			return fmt.Errorf("hub EDGE2 holds %d of edge2's 11 messages", n)
		}
		return nil
	})
}

// TestLeafHubDeniesDestinationWaits: the hub authenticates leafnodes with
// an [auth] user whose publish_allow takes the hub's JetStream API but not
// this edge's destination (edge.edge1.>), so the hub sends the edge no
// interest there and each publish gets "no responders" at once, while the
// hub's stream takes the subject. That is the hub's configuration, not the
// message: each must wait in its place (as for a full hub stream), with
// /healthz naming the cause, not spend max_deliver deliveries in a second
// or two and be dead-lettered; once the hub lets the edge publish there,
// every message arrives once.
func TestLeafHubDeniesDestinationWaits(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	pw := filepath.Join(dir, "leaf.pw")
	if err := os.WriteFile(pw, []byte("leaf-password-123\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	hash, err := bcrypt.GenerateFromPassword([]byte("leaf-password-123"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	const allow = `publish_allow = ["edge.other.>", "$JS.hub.API.>", "_INBOX.>"]`
	appHash, err := bcrypt.GenerateFromPassword([]byte(leafAppPassword), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	hub := newLeafHub(t, "10m", fmt.Sprintf("\n[auth.users.leaf]\npassword = %q\n%s\n\n[auth.users.app]\npassword = %q\n", hash, allow, appHash))
	hub.start(t)
	edge := newLeafEdge(t, "edge1", fmt.Sprintf("127.0.0.1:%d", hub.leafPort), "")
	edge.inst.cfg = e2eWriteConfig(t, strings.Replace(readFile(t, edge.inst.cfg), "[streams.ORDERS]", fmt.Sprintf("user = \"leaf\"\npassword_file = %q\n\n[streams.ORDERS]", pw), 1))
	edge.start(t)
	defer edge.proc.stop()
	_, ejs := e2eConnect(t, edge.inst)
	leafPublish(t, ejs, 0, 3)
	natstest.CheckFor(t, 20*time.Second, 200*time.Millisecond, func() error {
		if h := edge.get(t, "/healthz"); !strings.Contains(h, `"degraded"`) || !strings.Contains(h, "no responders") {
			return fmt.Errorf("edge /healthz does not name the publishes nobody answers:\n%s", h)
		}
		return nil
	})
	time.Sleep(2 * time.Second) // deliveries would be spent meanwhile
	if n := natstest.StreamInfo(t, ejs, "ORDERS_DLQ").State.Msgs; n != 0 {
		t.Fatalf("the edge dead-lettered %d message(s) the hub did not let it publish", n)
	}
	hub.proc.stop()
	hub.inst.cfg = e2eWriteConfig(t, strings.Replace(readFile(t, hub.inst.cfg), allow, `publish_allow = ["edge.>", "$JS.hub.API.>", "_INBOX.>"]`, 1))
	hub.start(t)
	defer hub.proc.stop()
	wantExactlyOnce(t, hubCounts(t, leafConnect(t, hub, "app"), 3, 30*time.Second), map[string]uint64{"edge1": 3})
}

// TestLeafReloadWhileHubWindowShort: the hub was restarted with a
// duplicate window shorter than twice the edge's forward.timeout, and
// forwarding waits for it (named in /healthz). A reload of the edge that
// restarts the forward workers (another forward.timeout) must leave them
// waiting the same way, not refuse them as a start does ("the consumer
// has none until the next restart", a restart that would then refuse to
// start at all): once the hub's window is long enough again, every message
// arrives without a restart of the edge.
func TestLeafReloadWhileHubWindowShort(t *testing.T) {
	t.Parallel()
	hub, edge, _, ejs := startLeafPair(t, "10m", "", "")
	hub.proc.stop()
	long := readFile(t, hub.inst.cfg)
	hub.inst.cfg = e2eWriteConfig(t, strings.Replace(long, `duplicate_window = "10m"`, `duplicate_window = "5s"`, 1))
	hub.start(t)
	natstest.CheckFor(t, 20*time.Second, 200*time.Millisecond, func() error {
		if h := edge.get(t, "/healthz"); !strings.Contains(h, "duplicate window is too short") {
			return fmt.Errorf("edge /healthz: %s", h)
		}
		return nil
	})
	edge.proc.reloadWith(edge.inst.cfg, readFile(t, edge.inst.cfg)+"[consumers.FORWARD.forward]\ntimeout = \"5s\"\n")
	leafPublish(t, ejs, 0, 3)
	hub.proc.stop()
	hub.inst.cfg = e2eWriteConfig(t, long)
	hub.start(t)
	_, hjs := e2eConnect(t, hub.inst)
	wantExactlyOnce(t, hubCounts(t, hjs, 3, 30*time.Second), map[string]uint64{"edge1": 3})
}

// TestLeafHubDeniesAPINamed: the hub's leafnode user may publish to the
// edge's destination but not to the hub's JetStream API, so the edge's
// check of the hub's stream gets "no responders". /healthz must say what
// to check — the permission on $JS.hub.API.> — not only that the hub
// "does not answer" while its link is up.
func TestLeafHubDeniesAPINamed(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	pw := filepath.Join(dir, "leaf.pw")
	if err := os.WriteFile(pw, []byte("leaf-password-123\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	hash, err := bcrypt.GenerateFromPassword([]byte("leaf-password-123"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	hub := newLeafHub(t, "10m", fmt.Sprintf("\n[auth.users.leaf]\npassword = %q\npublish_allow = [\"edge.>\", \"_INBOX.>\"]\n", hash))
	hub.start(t)
	defer hub.proc.stop()
	edge := newLeafEdge(t, "edge1", fmt.Sprintf("127.0.0.1:%d", hub.leafPort), "")
	edge.inst.cfg = e2eWriteConfig(t, strings.Replace(readFile(t, edge.inst.cfg), "[streams.ORDERS]", fmt.Sprintf("user = \"leaf\"\npassword_file = %q\n\n[streams.ORDERS]", pw), 1))
	edge.start(t)
	defer edge.proc.stop()
	natstest.CheckFor(t, 20*time.Second, 200*time.Millisecond, func() error {
		if h := edge.get(t, "/healthz"); !strings.Contains(h, `publish to $JS.hub.API.\u003e`) && !strings.Contains(h, `publish to $JS.hub.API.>`) {
			return fmt.Errorf("edge /healthz does not name the JetStream API permission:\n%s", h)
		}
		return nil
	})
}

// TestLeafHubStoreWiped: the hub loses its store (stopped, its store
// directory removed, started again: it creates its stream anew). The
// running edge sees the hub's stream created anew once the link is back
// and sends again, from its own stream, every message the hub had
// acknowledged: the hub holds each exactly once again, and the edge's
// metrics count them.
func TestLeafHubStoreWiped(t *testing.T) {
	t.Parallel()
	hub, edge, _, ejs := startLeafPair(t, "2m", "", "")
	_, hjs := e2eConnect(t, hub.inst)
	leafPublish(t, ejs, 0, 50)
	hubCounts(t, hjs, 50, 30*time.Second)
	hub.proc.stop()
	if err := os.RemoveAll(hub.inst.store); err != nil {
		t.Fatal(err)
	}
	hub.start(t)
	_, hjs = e2eConnect(t, hub.inst)
	leafPublish(t, ejs, 50, 10)
	wantExactlyOnce(t, hubCounts(t, hjs, 60, 30*time.Second), map[string]uint64{"edge1": 60})
	if m := edge.get(t, "/metrics"); !strings.Contains(m, `holdfast_forward_resent_total{consumer="FORWARD"} 50`) {
		t.Errorf("edge metrics:\n%s", grepLines(m, "holdfast_forward_"))
	}
	// The hub, which lost its state file with its store, learns it from
	// the edge.
	if m := hub.get(t, "/metrics"); !strings.Contains(m, `holdfast_edge_resent_total{edge="edge1",stream="ORDERS"} 50`) {
		t.Errorf("hub metrics:\n%s", grepLines(m, "holdfast_edge_"))
	}
	if !strings.Contains(hub.proc.stderr.String(), "an edge sends again messages this hub had acknowledged and lost") {
		t.Error("the hub did not log that it had lost the edge's messages")
	}
	if st := runHoldfast(t, nil, "status", "--config", hub.inst.cfg); !strings.Contains(st.stdout, "LOST BY THIS HUB: 50 sent again, 0 lost on both sides") {
		t.Errorf("hub status:\n%s", st.stdout)
	}
	if h := hub.get(t, "/healthz"); !strings.Contains(h, "this hub lost messages of edge edge1 (stream ORDERS) that it had acknowledged") {
		t.Errorf("hub /healthz does not say it lost edge1's messages:\n%s", h)
	}
}

// sourcesOf describes a stream's mirror and sources as the server sees
// them, for a failure message.
func sourcesOf(si *jetstream.StreamInfo) string {
	var b strings.Builder
	for _, src := range append([]*jetstream.StreamSourceInfo{si.Mirror}, si.Sources...) {
		if src == nil {
			continue
		}
		fmt.Fprintf(&b, "[%s lag %d active %v error %v] ", src.Name, src.Lag, src.Active, src.Error)
	}
	return b.String()
}
