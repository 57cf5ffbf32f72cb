// Package daemon is the holdfast appliance's assembly: from a validated
// config it locks the store and opens the HTTP listener, starts the
// embedded NATS server, bootstraps the streams and consumers, starts the
// workers, group commit, the leafnode view, the monitor and the status
// responder — in that order, closed in reverse — and applies reloads.
// CollectStatus is the client side of the status responder: it reads a
// running holdfast over a NATS connection for `holdfast status`.
// `holdfast run` drives it with signals and sd_notify; it imports nothing
// from cmd.
package daemon
