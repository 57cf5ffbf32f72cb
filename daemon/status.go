package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/holdfast-io/holdfast/ingest"
	"github.com/holdfast-io/holdfast/internal/subjects"
	"github.com/holdfast-io/holdfast/pipeline/forward"
	"github.com/holdfast-io/holdfast/pipeline/monitor"
)

// StatusReply is the daemon's answer on subjects.Status.
type StatusReply struct {
	Version    string              `json:"version"`
	NATSServer string              `json:"nats_server"`
	ServerName string              `json:"server_name"`
	PID        int                 `json:"pid"`
	Started    time.Time           `json:"started"`
	StoreDir   string              `json:"store_dir"`
	Sync       string              `json:"sync"`
	Domain     string              `json:"domain,omitempty"`
	HTTPListen string              `json:"http_listen,omitempty"`
	FailOnLoss bool                `json:"fail_on_loss"`
	Health     monitor.Health      `json:"health"`
	Report     *monitor.Report     `json:"report"`
	Cluster    *ClusterStatus      `json:"cluster,omitempty"`
	Leafnodes  *forward.EdgeStatus `json:"leafnodes,omitempty"`
	// GroupCommit holds the counters of each stream with group commit.
	GroupCommit map[string]ingest.Stats `json:"group_commit,omitempty"`
}

// serveStatus answers subjects.Status on the daemon's in-process connection
// with a fresh check.
func serveStatus(d *Daemon) (*nats.Subscription, error) {
	started := time.Now()
	cfg := d.cfg // its server, jetstream and http sections never change at reload
	subject := subjects.Status(cfg.Server.Name)
	sub, err := d.srv.Conn().Subscribe(subject, func(m *nats.Msg) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		reply := StatusReply{
			Version:    d.version,
			NATSServer: server.VERSION,
			ServerName: cfg.Server.Name,
			PID:        os.Getpid(),
			Started:    started,
			StoreDir:   d.srv.StoreDir(),
			Sync:       cfg.JetStream.Sync,
			Domain:     cfg.JetStream.Domain,
			HTTPListen: d.http.Addr(),
			FailOnLoss: cfg.HTTP.FailOnLoss,
			Report:     d.monitor.CheckNow(ctx),
			Cluster:    clusterView(d.srv.NATS()),
			Leafnodes:  d.edge.Status(ctx),
		}
		reply.Health = d.monitor.Health()
		reply.GroupCommit = d.groupCommitStats()
		data, err := json.Marshal(reply)
		if err != nil {
			d.log.Error("cannot encode status", "err", err)
			return
		}
		if err := m.Respond(data); err != nil {
			d.log.Warn("cannot answer status request", "err", err)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("cannot serve %s: %w", subject, err)
	}
	return sub, nil
}
