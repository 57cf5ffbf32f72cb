package main

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/holdfast-io/holdfast/internal/natstest"
)

// fleetEdges is the size of the fleet TestLeafFleetIntoHubCluster runs.
const fleetEdges = 20

// TestLeafFleetIntoHubCluster: 20 edges forward into a 3-node hub
// cluster, each edge's remote naming all three nodes and the hub's stream
// on its defaults (no duplicate_window). The node most edges are linked to
// is killed (kill -9) while they forward. Every edge's messages are on the
// hub once and in the edge's order, and each surviving hub node's status
// and metrics list all 20 edges as linked (to whichever node), with their
// last origin sequence and nothing waiting on them.
func TestLeafFleetIntoHubCluster(t *testing.T) {
	t.Parallel()
	nodes := newTestCluster(t, 3, "")
	var urls []string
	for i, nd := range nodes {
		leafPort := natstest.FreePort(t)
		urls = append(urls, fmt.Sprintf("%q", fmt.Sprintf("nats-leaf://127.0.0.1:%d", leafPort)))
		text := strings.Replace(readFile(t, nd.cfg), "[jetstream]\n", "[jetstream]\ndomain = \"hub\"\n", 1)
		text += fmt.Sprintf("\n[leafnodes]\nlisten = \"127.0.0.1:%d\"\n\n[streams.EDGE]\nsubjects = [\"edge.>\"]\n", leafPort)
		nodes[i].cfg = e2eWriteConfig(t, text)
		nodes[i].inst.cfg = nodes[i].cfg
	}
	startAll(t, nodes)

	edges := make([]*leafNode, fleetEdges)
	for i := range edges {
		e := newLeafEdge(t, fmt.Sprintf("edge%02d", i+1), "unused", "")
		// Each edge lists the nodes starting with a different one, so the
		// links spread over the cluster.
		rot := append(append([]string{}, urls[i%3:]...), urls[:i%3]...)
		e.inst.cfg = e2eWriteConfig(t, strings.Replace(readFile(t, e.inst.cfg), `url = "nats-leaf://unused"`,
			"urls = ["+strings.Join(rot, ", ")+"]", 1))
		e.proc = startHoldfast(t, e.inst.cfg)
		edges[i] = e
	}
	for _, e := range edges {
		e.proc.waitReadyWithin(2 * time.Minute)
	}

	const first, second = 100, 50
	publishAll := func(from, count int) {
		for _, e := range edges {
			_, js := e2eConnect(t, e.inst)
			leafPublish(t, js, from, count)
		}
	}
	publishAll(0, first)
	_, hjs := e2eConnect(t, nodes[1].inst)
	hubHoldsAtLeast(t, hjs, fleetEdges*first/4)
	nodes[0].proc.signal(syscall.SIGKILL)
	killed := time.Now()
	publishAll(first, second)
	natstest.CheckFor(t, 2*time.Minute, 500*time.Millisecond, func() error {
		return fleetShort(t, hjs, edges, first+second)
	})
	t.Logf("all %d messages of %d edges on the hub cluster %s after the kill -9 of node n1",
		fleetEdges*(first+second), fleetEdges, time.Since(killed).Round(time.Millisecond))

	seen, order := hubRead(t, hjs, fleetEdges*(first+second), time.Minute)
	want := map[string]uint64{}
	for _, e := range edges {
		want[e.name] = first + second
	}
	wantExactlyOnce(t, seen, want)
	for edge, seqs := range order {
		for i, s := range seqs {
			if s != uint64(i+1) {
				t.Errorf("edge %s: the hub's message %d has origin sequence %d: out of the edge's order", edge, i+1, s)
				break
			}
		}
	}

	// One view of the fleet from either surviving node.
	for _, nd := range nodes[1:] {
		natstest.CheckFor(t, 30*time.Second, 500*time.Millisecond, func() error {
			st := runHoldfast(t, nil, "status", "--config", nd.cfg)
			m := (&leafNode{name: nd.name, httpAddr: nd.httpAddr}).get(t, "/metrics")
			for _, e := range edges {
				line := fmt.Sprintf("Edge       %s stream ORDERS: linked, last seq %d, 0 waiting there then", e.name, first+second)
				if !strings.Contains(st.stdout, line) {
					return fmt.Errorf("%s's status lacks %q:\n%s", nd.name, line, st.stdout)
				}
				if metric := fmt.Sprintf(`holdfast_edge_linked{edge=%q,stream="ORDERS"} 1`, e.name); !strings.Contains(m, metric) {
					return fmt.Errorf("%s's metrics lack %s", nd.name, metric)
				}
			}
			return nil
		})
	}
	// An edge that goes away shows as not linked, on both nodes.
	edges[0].proc.signal(syscall.SIGKILL)
	for _, nd := range nodes[1:] {
		natstest.CheckFor(t, 30*time.Second, 500*time.Millisecond, func() error {
			if m := (&leafNode{name: nd.name, httpAddr: nd.httpAddr}).get(t, "/metrics"); !strings.Contains(m, fmt.Sprintf(`holdfast_edge_linked{edge=%q,stream="ORDERS"} 0`, edges[0].name)) {
				return fmt.Errorf("%s still shows %s linked:\n%s", nd.name, edges[0].name, grepLines(m, "holdfast_edge_linked"))
			}
			return nil
		})
	}
}

// fleetShort says which edges the hub's stream EDGE holds fewer than want
// messages of, with what each of those edges says of its forwarding; nil
// when it holds want of each.
func fleetShort(t *testing.T, hjs jetstream.JetStream, edges []*leafNode, want uint64) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := hjs.Stream(ctx, "EDGE")
	if err != nil {
		return err
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter("edge.>"))
	if err != nil {
		return err
	}
	held := map[string]uint64{}
	for subj, n := range info.State.Subjects {
		if tok := strings.SplitN(subj, ".", 3); len(tok) == 3 {
			held[tok[1]] += n
		}
	}
	var short []string
	for _, e := range edges {
		if held[e.name] != want {
			short = append(short, fmt.Sprintf("%s: %d of %d; its forwarding:\n%s\n%s", e.name, held[e.name], want,
				grepLines(e.get(t, "/metrics"), "holdfast_forward_"), e.get(t, "/healthz")))
		}
	}
	if len(short) > 0 {
		return fmt.Errorf("the hub holds %d messages; short:\n%s", info.State.Msgs, strings.Join(short, "\n"))
	}
	return nil
}
