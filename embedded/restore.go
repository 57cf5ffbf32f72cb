package embedded

import (
	"math"
	"strings"

	"github.com/nats-io/nats-server/v2/server"
)

// RestoreRunning tells whether nats-server still runs a restore of stream:
// the restore's subscription to its data ($JS.SNAPSHOT.RESTORE.<stream>.<id>)
// stays until the restore ended, announced or not. The server gives up a
// restore whose client stopped sending after 5 s, without its
// RESTORE_COMPLETE advisory. known is false in a cluster, where the
// restore runs on the stream's leader, maybe another node.
func (s *Server) RestoreRunning(stream string) (running, known bool) {
	if s.ns == nil || s.ns.JetStreamIsClustered() {
		return false, false
	}
	sz, err := s.ns.Subsz(&server.SubszOptions{Subscriptions: true, Limit: math.MaxInt32})
	if err != nil {
		return false, false
	}
	prefix := "$JS.SNAPSHOT.RESTORE." + stream + "."
	for _, sub := range sz.Subs {
		if strings.HasPrefix(sub.Subject, prefix) {
			return true, true
		}
	}
	return false, true
}
