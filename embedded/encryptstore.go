package embedded

import (
	"path/filepath"
	"sort"
	"strings"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/holdfast-io/holdfast/config"
	"github.com/holdfast-io/holdfast/embedded/store"
)

// protectClearStreams runs before the server starts: it puts back the
// copies of an encrypting start that did not finish and, with a key,
// re-seals the key files under it (rekey) and copies the clear-text
// streams the server is about to encrypt. It returns the directories of
// the streams copied.
func (s *Server) protectClearStreams(sec *config.Secrets) ([]string, error) {
	restored, err := store.RestoreClearCopies(s.store.Path)
	if err != nil {
		return nil, err
	}
	if len(restored) > 0 {
		s.log.Warn("the start that converted streams (encrypted them, or to another cipher) did not finish: they are put back as they were before it",
			"streams", strings.Join(restored, ","))
	}
	if sec.EncryptionKey == "" {
		return nil, nil
	}
	js := s.cfg.JetStream
	s.log.Info("store encrypted at rest", "cipher", js.EncryptionCipher, "key_file", js.EncryptionKeyFile,
		"old_key_file", js.EncryptionOldKeyFile)
	if err := s.rekey(sec); err != nil {
		return nil, err
	}
	clear, other, err := store.ConvertingStreams(filepath.Join(s.store.Path, server.JetStreamStoreDir), sec.EncryptionKey, store.Cipher(js.EncryptionCipher))
	if err != nil || len(clear)+len(other) == 0 {
		return nil, err
	}
	if s.cfg.Cluster.Enabled() {
		// A cluster node loads its streams once the meta group runs,
		// after the server is ready: the copies could not be told from
		// streams still to come, and putting one back could move a
		// replica the server is opening. Its replicas are on the others.
		s.log.Warn("the server converts streams at this start (clear text to encrypted, or to jetstream.encryption_cipher) without the copy a single node keeps: "+
			"a node killed during it may lose its replicas of them and catch up from the other nodes; convert one node at a time",
			"streams", len(clear)+len(other))
		return nil, nil
	}
	if err := store.CopyClearStreams(s.store.Path, clear, other, s.store.Free); err != nil {
		return nil, err
	}
	dirs := append(clear, other...)
	s.log.Info("the server converts streams at this start (clear text to encrypted, or to jetstream.encryption_cipher): "+
		"a copy is kept until it has converted them all", "streams", streamNames(dirs), "cipher", js.EncryptionCipher,
		"copy", filepath.Join(s.store.Path, store.EncryptingDirName))
	return dirs, nil
}

// streamNames lists the names of the stream directories dirs, sorted.
func streamNames(dirs []string) string {
	var names []string
	for _, d := range dirs {
		names = append(names, filepath.Base(d))
	}
	sort.Strings(names)
	return strings.Join(names, ",")
}

// finishEncrypting runs once the server is ready (it recovers, and so
// encrypts, every stream before it listens): it removes the copies. A
// stream the server did not encrypt could not be loaded (its warnings say
// why) and may be half converted: its copy is put back
// (store.PutBackUnconverted), so that it is as it was before this start,
// and the data-loss check deals with it as with any stream the server
// could not load.
func (s *Server) finishEncrypting(dirs []string, key string) error {
	if len(dirs) == 0 {
		return nil
	}
	putBack, err := store.PutBackUnconverted(s.store.Path, key, store.Cipher(s.cfg.JetStream.EncryptionCipher))
	if err != nil {
		return err
	}
	if len(putBack) > 0 {
		s.log.Warn("the server did not load (and so not convert) these streams, see its warnings: put back as they were before this start",
			"streams", strings.Join(putBack, ","))
	}
	if err := store.RemoveCopies(s.store.Path); err != nil {
		return err
	}
	s.log.Info("streams converted (encrypted, or to jetstream.encryption_cipher); their copies removed", "streams", streamNames(dirs))
	return nil
}
