package embedded

import (
	"encoding/binary"
	"hash/fnv"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// StoreActivity returns a fingerprint of the positions of every stream
// and consumer this server holds (a replica, in a cluster): their names,
// when each stream was created, its first and last sequences, message and
// byte counts, and each consumer's delivered and ack floor positions,
// pending and redelivered counts. It changes whenever a message is
// stored, removed, delivered or acknowledged, and whenever a stream or
// consumer is created or deleted; it stays the same while nothing
// happens, so that watches which read the state through the JetStream API
// can skip their reads then. It reads the server in-process (no message,
// no disk access); 0 when JetStream does not run.
//
// The watches that ask each second share one reading: a fingerprint less
// than activityMaxAge old is returned again. A change is then seen up to
// that much later; a watch that read the state after its fingerprint
// sees the fingerprint differ at its next turn and reads again.
func (s *Server) StoreActivity() uint64 {
	s.activityMu.Lock()
	defer s.activityMu.Unlock()
	if now := time.Now(); now.Sub(s.activityAt) >= activityMaxAge {
		s.activity, s.activityAt = s.storeActivity(), now
	}
	return s.activity
}

// activityMaxAge is how long a StoreActivity fingerprint is used again.
const activityMaxAge = 500 * time.Millisecond

func (s *Server) storeActivity() uint64 {
	if s.ns == nil || !s.ns.JetStreamEnabled() {
		return 0
	}
	jsz, err := s.ns.Jsz(&server.JSzOptions{Accounts: true, Streams: true, Consumer: true})
	if err != nil {
		return 0
	}
	h := fnv.New64a()
	var buf [8]byte
	num := func(v uint64) {
		binary.LittleEndian.PutUint64(buf[:], v)
		h.Write(buf[:])
	}
	str := func(v string) {
		h.Write([]byte(v))
		h.Write([]byte{0})
	}
	accounts := jsz.AccountDetails
	slices.SortFunc(accounts, func(a, b *server.AccountDetail) int { return strings.Compare(a.Name, b.Name) })
	for _, a := range accounts {
		str(a.Name)
		streams := a.Streams
		slices.SortFunc(streams, func(a, b server.StreamDetail) int { return strings.Compare(a.Name, b.Name) })
		for _, st := range streams {
			str(st.Name)
			num(uint64(st.Created.UnixNano()))
			num(st.State.FirstSeq)
			num(st.State.LastSeq)
			num(st.State.Msgs)
			num(st.State.Bytes)
			consumers := st.Consumer
			slices.SortFunc(consumers, func(a, b *server.ConsumerInfo) int { return strings.Compare(a.Name, b.Name) })
			for _, c := range consumers {
				// NumWaiting is left out: an idle pull consumer's requests
				// come and go.
				str(c.Name)
				num(c.Delivered.Stream)
				num(c.AckFloor.Stream)
				num(uint64(c.NumAckPending))
				num(uint64(c.NumRedelivered))
				num(c.NumPending)
			}
		}
	}
	return h.Sum64()
}
