package store

// What holdfast keeps in the store directory beside the server's own
// jetstream/ directory.

// StateFileName is the file in the store dir where holdfast records each
// stream's last sequence and each consumer's ack floor. Removing it makes
// the next start accept whatever the store holds.
const StateFileName = "holdfast-state.json"

// PeerNamesFileName is the file in the store dir where holdfast records
// the server name of every cluster peer it has seen, by Raft peer ID, to
// name a peer the server knows only by its ID (one down since the whole
// cluster restarted). Removing it loses only those names.
const PeerNamesFileName = "holdfast-peers.json"

// OrphanDirName is the directory in the store dir where the data directory
// of a vanished stream is moved before the stream is created anew.
const OrphanDirName = "holdfast-orphans"

// EncryptingDirName is the directory in the store dir holding the copies
// of the clear-text streams while the server encrypts them.
const EncryptingDirName = "holdfast-encrypting"

// RecoveryLinksDirName is the directory in the store dir that holds hard
// links to the streams' files while the server recovers them.
const RecoveryLinksDirName = "holdfast-recovery-links"

// SyncGuardDirName is the directory in the store dir that holds, with
// jetstream.commit_window, a hard link to each message block and
// definition as holdfast last flushed it (see Syncer and RestoreSyncGuard).
const SyncGuardDirName = "holdfast-sync-guard"
