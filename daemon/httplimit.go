package daemon

import (
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
)

// httpMaxConns bounds the [http] listener's open connections. Each takes
// a file descriptor from the limit the NATS server's clients and the
// store's files share, and a client needs no credentials to open one and
// keep it for httpReadHeaderTimeout; Prometheus, probes and a few
// browsers need a few dozen.
const httpMaxConns = 256

// boundedListener closes, as soon as it accepts it, a connection that
// would exceed max open ones: it holds no descriptor beyond the bound.
type boundedListener struct {
	net.Listener
	max  int64
	log  *slog.Logger
	open atomic.Int64
	// full is set while connections are refused, so that it is logged
	// once each time the bound is reached.
	full atomic.Bool
}

func (l *boundedListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.open.Add(1) > l.max {
			l.open.Add(-1)
			_ = c.Close()
			if l.full.CompareAndSwap(false, true) {
				l.log.Warn("too many connections to the http listener: closing new ones until some close", "max", l.max)
			}
			continue
		}
		l.full.Store(false)
		return &boundedConn{Conn: c, release: func() { l.open.Add(-1) }}, nil
	}
}

// boundedConn gives its place back once, when it is closed.
type boundedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *boundedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// CloseWrite lets the HTTP server half-close the connection, as it
// does on a TCP connection before closing it after an error.
func (c *boundedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
