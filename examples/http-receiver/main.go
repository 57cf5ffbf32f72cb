// Command http-receiver is the service of examples/http-receiver: it takes
// orders POSTed by holdfast's http handler, and answers the first delivery
// of each order 503 with Retry-After: 1, as a service does while it is
// busy, so that holdfast's retry shows. It prints each order it takes.
//
//	go run ./examples/http-receiver -listen 127.0.0.1:8080
package main

import (
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"sync"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:8080", "address to listen on")
	flag.Parse()
	var mu sync.Mutex
	refused := map[string]bool{}
	http.HandleFunc("POST /orders", func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		// The same order comes again with the same key: take it once.
		key := r.Header.Get("Idempotency-Key")
		mu.Lock()
		first := !refused[key]
		refused[key] = true
		mu.Unlock()
		if first {
			w.Header().Set("Retry-After", "1")
			http.Error(w, "busy, try again in a second", http.StatusServiceUnavailable)
			fmt.Printf("busy: refused %s (delivery %s) with 503\n", key, r.Header.Get("Holdfast-Delivery"))
			return
		}
		fmt.Printf("took %s (delivery %s): %s\n", key, r.Header.Get("Holdfast-Delivery"), body)
		w.WriteHeader(http.StatusNoContent)
	})
	log.Printf("http-receiver on http://%s/orders", *listen)
	log.Fatal(http.ListenAndServe(*listen, nil))
}
