package ingest

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/holdfast-io/holdfast/internal/natstest"
)

// BenchmarkGroupCommitAsync publishes b.N messages of 128 B from 4
// PublishAsync publishers (window 500 each) through a Committer on a
// sync-always file store, over TCP on 127.0.0.1, as nats bench does.
// Profile it with -cpuprofile to see what bounds group commit.
func BenchmarkGroupCommitAsync(b *testing.B) {
	for _, pubs := range []int{1, 4, 16} {
		b.Run(fmt.Sprintf("publishers=%d", pubs), func(b *testing.B) {
			s := natstest.RunServer(b, natstest.SyncAlways)
			js := natstest.JetStream(b, natstest.Connect(b, s))
			c := startIngest(b, s, js, Options{Stream: "S", Subjects: []string{"s.*"}}, nil)
			payload := make([]byte, 128)
			per := b.N/pubs + 1
			b.ResetTimer()
			var wg sync.WaitGroup
			for range pubs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					pjs, _ := jetstream.New(natstest.Connect(b, s), jetstream.WithPublishAsyncMaxPending(500))
					for range per {
						if _, err := pjs.PublishAsync("s.a", payload, jetstream.WithStallWait(30*time.Second)); err != nil {
							b.Error(err)
							return
						}
					}
					select {
					case <-pjs.PublishAsyncComplete():
					case <-time.After(time.Minute):
						b.Error("acks missing")
					}
				}()
			}
			wg.Wait()
			b.ReportMetric(float64(per*pubs)/b.Elapsed().Seconds(), "msgs/s")
			if st := c.Stats(); st.Batches > 0 {
				b.ReportMetric(float64(st.BatchedMsgs)/float64(st.Batches), "msgs/batch")
				b.ReportMetric(float64(st.BatchTime.Microseconds())/float64(st.Batches), "µs/batch")
				b.ReportMetric(float64(st.Alone), "alone")
			}
		})
	}
}
