// Command lazyfs serves a lazyfs mount for a test binary as a child
// process (lazyfs.MountIn), answering its requests on stdin and stdout:
//
//	lazyfs BACKING MOUNTPOINT
//
// Built without -race by the tests that use it, so that the file system
// under the processes they test costs what it would in production code.
package main

import (
	"fmt"
	"os"

	"github.com/holdfast-io/holdfast/internal/lazyfs"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: lazyfs BACKING MOUNTPOINT")
		os.Exit(2)
	}
	if err := lazyfs.Serve(os.Args[1], os.Args[2], os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "lazyfs:", err)
		os.Exit(1)
	}
}
