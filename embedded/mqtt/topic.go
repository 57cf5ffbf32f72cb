package mqtt

import "strings"

// natsSubject is the subject nats-server publishes a device's PUBLISH on,
// from its topic name (nats-server's mqttTopicToNATSPubSubject, which is
// not exported; TestTopicsBecomeTheServersSubjects holds the two
// together):
//
//   - a '/' between two levels becomes '.' (a/b -> a.b);
//   - an empty level becomes '/': a leading '/' is "/.", a '/' before
//     another or at the end "./" (a//b -> a./.b);
//   - a '.' becomes "//".
//
// ok is false for what the server refuses itself (an empty topic,
// whitespace, DEL, the wildcards '+' and '#'): the gate leaves those to it.
func natsSubject(topic []byte) (subject string, ok bool) {
	if len(topic) == 0 {
		return "", false
	}
	var b strings.Builder
	b.Grow(len(topic) + 4)
	var last byte
	for i, c := range topic {
		switch c {
		case '/':
			switch {
			case i == 0 || last == '.':
				b.WriteString("/.")
				last = '.'
			case i == len(topic)-1 || topic[i+1] == '/':
				b.WriteString("./")
				last = '/'
			default:
				b.WriteByte('.')
				last = '.'
			}
		case '.':
			b.WriteString("//")
			last = '/'
		case ' ', '\t', '\n', '\r', '\f', 0x7f, '+', '#':
			return "", false
		default:
			b.WriteByte(c)
			last = c
		}
	}
	if last == '.' {
		b.WriteByte('/')
	}
	return b.String(), true
}
