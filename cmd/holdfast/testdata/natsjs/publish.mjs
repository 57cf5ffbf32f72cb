// Publishes with JetStream over WebSocket, as a browser page would with
// nats.js, and prints the PubAck; then reads the message back with a
// core subscription of what the server delivers on the subject.
// Usage: node publish.mjs ws://127.0.0.1:PORT SUBJECT PAYLOAD
import WebSocket from "ws";
import { wsconnect } from "@nats-io/nats-core";
import { jetstream } from "@nats-io/jetstream";

globalThis.WebSocket = WebSocket; // Node 20 has none of its own

const [server, subject, payload] = process.argv.slice(2);
const nc = await wsconnect({ servers: server, timeout: 10000 });
const js = jetstream(nc);
const ack = await js.publish(subject, payload);
console.log(JSON.stringify({ stream: ack.stream, seq: ack.seq, duplicate: ack.duplicate }));
await nc.drain();
