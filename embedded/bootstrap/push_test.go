package bootstrap

import (
	"errors"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/holdfast-io/holdfast/internal/configtest"
	"github.com/holdfast-io/holdfast/internal/natstest"
)

// TestBootstrapRefusesPushConsumer: a durable push consumer made by a
// client (a store taken over from a hand-run nats-server) under a name the
// config gives a consumer. holdfast's workers pull: the start is refused
// with the consumer and what to do, and the consumer is left as it was.
func TestBootstrapRefusesPushConsumer(t *testing.T) {
	t.Parallel()
	cfg := configtest.Default(t)
	s, _ := bootstrapped(t, cfg)
	js := s.JetStream()
	ctx := natstest.Context(t)
	if err := js.DeleteConsumer(ctx, "ORDERS", "WORKER1"); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateOrUpdatePushConsumer(ctx, "ORDERS", jetstream.ConsumerConfig{Durable: "WORKER1", DeliverSubject: "deliver.worker1", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	err := Apply(ctx, js, cfg, s.base)
	if err == nil {
		t.Fatal("Bootstrap took a push consumer for its workers")
	}
	t.Logf("refused: %v", err)
	var de *DriftError
	if !errors.As(err, &de) || de.Name != "WORKER1" || !strings.Contains(err.Error(), "push") {
		t.Errorf("the error does not name WORKER1 as a push consumer: %v", err)
	}
	c, cerr := js.PushConsumer(ctx, "ORDERS", "WORKER1")
	if cerr != nil || c.CachedInfo().Config.DeliverSubject != "deliver.worker1" {
		t.Errorf("the push consumer changed: %v", cerr)
	}
}
