package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// peerNamesFile is the content of PeerNamesFileName.
type peerNamesFile struct {
	Version int `json:"version"`
	// Peers maps a Raft peer ID to the server name it stands for.
	Peers map[string]string `json:"peers"`
}

// ReadPeerNames returns the server names recorded in dir by Raft peer ID;
// an empty map and no error when none were recorded yet.
func ReadPeerNames(dir string) (map[string]string, error) {
	path := filepath.Join(dir, PeerNamesFileName)
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return map[string]string{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("cannot read %s: %w", path, err)
	}
	var f peerNamesFile
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("cannot parse %s (remove it: holdfast records the names again as it sees the nodes): %w", path, err)
	}
	if f.Peers == nil {
		f.Peers = map[string]string{}
	}
	return f.Peers, nil
}

// WritePeerNames records names (server names by Raft peer ID) in dir,
// atomically and durably.
func WritePeerNames(dir string, names map[string]string) error {
	b, err := json.MarshalIndent(peerNamesFile{Version: 1, Peers: names}, "", "  ")
	if err != nil {
		return err
	}
	if err := writeFile(dir, PeerNamesFileName, append(b, '\n')); err != nil {
		return fmt.Errorf("cannot record the cluster's node names: %w", err)
	}
	return nil
}
