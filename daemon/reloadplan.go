package daemon

import (
	"errors"
	"fmt"
	"os"
	"reflect"
	"slices"
	"strings"

	"github.com/holdfast-io/holdfast/config"
)

// ErrRestartNeeded is returned by a reload that was refused because
// some of its changes need a restart; nothing of it was applied.
var ErrRestartNeeded = errors.New("some changes need a restart")

// ReloadPlan is what a reload from the running config to the one on disk
// does: the keys it applies at run time, and the keys only a restart
// applies. A reload with any of the latter is refused as a whole.
type ReloadPlan struct {
	Apply   []string `json:"apply"`
	Restart []string `json:"restart"`
}

// Reloadable reports whether a reload applies the whole plan.
func (p ReloadPlan) Reloadable() bool { return len(p.Restart) == 0 }

// PlanReload compares the running config cur with next, key by key.
func PlanReload(cur, next *config.Config) ReloadPlan {
	p := ReloadPlan{Restart: restartOnlyChanges(cur, next)}
	if cur.Log.Level != next.Log.Level {
		p.Apply = append(p.Apply, "log.level")
	}
	p.Apply = append(p.Apply, changedKeys("run", cur.Run, next.Run)...)
	for _, name := range unionKeys(cur.StreamNames(), next.StreamNames()) {
		old, sc := cur.Streams[name], next.Streams[name]
		switch {
		case old == nil:
			p.Apply = append(p.Apply, fmt.Sprintf("streams.%s (new: created)", name))
		case sc == nil:
			p.Apply = append(p.Apply, fmt.Sprintf("streams.%s (left out: no longer watched, kept on the server)", name))
		case !reflect.DeepEqual(old, sc):
			p.Apply = append(p.Apply, changedKeys("streams."+name, *old, *sc)...)
		}
	}
	for _, name := range unionKeys(cur.ConsumerNames(), next.ConsumerNames()) {
		old, cc := cur.Consumers[name], next.Consumers[name]
		switch {
		case old == nil:
			p.Apply = append(p.Apply, fmt.Sprintf("consumers.%s (new: created, workers started)", name))
		case cc == nil:
			p.Apply = append(p.Apply, fmt.Sprintf("consumers.%s (left out: workers stopped, kept on the server)", name))
		case old.Stream != cc.Stream:
			// Its durable, workers, monitoring and dead letters all hang
			// on the stream: a restart moves them together.
			p.Restart = append(p.Restart, fmt.Sprintf("consumers.%s.stream (%s -> %s)", name, old.Stream, cc.Stream))
		case !sameConsumer(old, cc):
			p.Apply = append(p.Apply, changedKeys("consumers."+name, *old, *cc)...)
		}
	}
	return p
}

// sameConsumer reports whether a and b are the same settings, whether
// or not a table in the file configures them (Implied).
func sameConsumer(a, b *config.ConsumerConfig) bool {
	x, y := *a, *b
	x.Implied, y.Implied = false, false
	return reflect.DeepEqual(x, y)
}

// restartOnlyChanges names the keys that changed between cur and next
// and that only a restart applies.
func restartOnlyChanges(cur, next *config.Config) []string {
	var out []string
	was, is := restartOnly(cur), restartOnly(next)
	for _, key := range restartOnlyKeys {
		out = append(out, changedKeys(key, was[key], is[key])...)
	}
	return out
}

// restartOnlyKeys are the tables and keys only a restart applies; of
// the rest, only consumers.NAME.stream needs one.
var restartOnlyKeys = []string{"server", "jetstream", "cluster", "leafnodes", "mqtt", "websocket", "http", "auth", "tls", "log.format"}

// restartOnly is cfg's value of each of restartOnlyKeys.
func restartOnly(cfg *config.Config) map[string]any {
	return map[string]any{"server": cfg.Server, "jetstream": cfg.JetStream, "cluster": cfg.Cluster, "leafnodes": cfg.LeafNodes,
		"mqtt": cfg.MQTT, "websocket": cfg.WebSocket,
		"http": cfg.HTTP, "auth": cfg.Auth, "tls": cfg.TLS, "log.format": cfg.Log.Format}
}

// RestartOnly reports whether a change of the key at path (as
// config.Keys names it) needs a restart; a reload applies the others.
func RestartOnly(path string) bool {
	if path == "consumers.NAME.stream" {
		return true
	}
	for _, k := range restartOnlyKeys {
		if path == k || strings.HasPrefix(path, k+".") {
			return true
		}
	}
	return false
}

// changedKeys names the fields of a config table that differ between old
// and next by their key path ("leafnodes.listen"); prefix itself when the
// values are not tables or differ only where no key reaches.
func changedKeys(prefix string, old, next any) []string {
	if reflect.DeepEqual(old, next) {
		return nil
	}
	ov, nv := reflect.ValueOf(old), reflect.ValueOf(next)
	if ov.Kind() != reflect.Struct || ov.Type() != nv.Type() {
		return []string{prefix}
	}
	var out []string
	for i := range ov.NumField() {
		f := ov.Type().Field(i)
		key, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
		if !f.IsExported() || key == "-" {
			continue
		}
		if key == "" {
			key = f.Name
		}
		if !reflect.DeepEqual(ov.Field(i).Interface(), nv.Field(i).Interface()) {
			out = append(out, prefix+"."+key)
		}
	}
	if len(out) == 0 {
		return []string{prefix}
	}
	return out
}

// unionKeys returns the names in a or b, sorted, each once.
func unionKeys(a, b []string) []string {
	out := slices.Concat(a, b)
	slices.Sort(out)
	return slices.Compact(out)
}

// restartCommand is how the operator restarts holdfast: systemctl under
// systemd (which sets INVOCATION_ID and NOTIFY_SOCKET for its services).
func restartCommand() string {
	if os.Getenv("INVOCATION_ID") != "" || os.Getenv("NOTIFY_SOCKET") != "" {
		return "systemctl restart holdfast"
	}
	return "restart holdfast"
}

// restartWarning is the health warning of a refused reload.
func restartWarning(keys []string) string {
	w := "config on disk differs from the running config: restart to apply " + strings.Join(keys, ", ")
	if cmd := restartCommand(); cmd != "restart holdfast" {
		w += " (" + cmd + ")"
	}
	return w
}
