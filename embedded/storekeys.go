package embedded

import (
	"maps"
	"path/filepath"
	"slices"
	"strings"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/holdfast-io/holdfast/config"
	"github.com/holdfast-io/holdfast/embedded/store"
)

// rekey runs store.Rekey on the store before the server opens it, and says
// what it did.
func (s *Server) rekey(sec *config.Secrets) error {
	js := s.cfg.JetStream
	res, err := store.Rekey(filepath.Join(s.store.Path, server.JetStreamStoreDir), sec.EncryptionKey, sec.OldEncryptionKey,
		js.EncryptionKeyFile, js.EncryptionOldKeyFile)
	if err != nil {
		return err
	}
	for _, d := range res.Damaged {
		s.log.Warn("damaged key file: what it protects cannot be read with any key; the server drops it, and the data-loss check reports what is lost", "key_file", d)
	}
	switch {
	case res.Rewrapped > 0:
		s.log.Info("encryption key rotated: key files re-sealed under jetstream.encryption_key_file; "+
			"jetstream.encryption_old_key_file can be removed from the config",
			"key_files", res.Rewrapped, "of", res.Total, "streams", strings.Join(slices.Sorted(maps.Keys(res.Streams)), ","),
			"key_file", js.EncryptionKeyFile)
	case sec.OldEncryptionKey != "":
		s.log.Info("every key file of the store opens with jetstream.encryption_key_file: "+
			"jetstream.encryption_old_key_file is no longer needed and can be removed from the config",
			"key_files", res.Total, "old_key_file", js.EncryptionOldKeyFile)
	}
	return nil
}
