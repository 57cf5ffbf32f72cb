// Package pipeline runs in-process workers that hand each message of a
// durable JetStream consumer to a handler.Handler and acknowledge it only
// after the handler succeeded; failures are retried with backoff and, in
// the end, dead-lettered. It owns the hot path: pull, ack, settle, dead
// letters, replay and the resume of interrupted messages.
package pipeline
