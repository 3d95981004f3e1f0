// Command hookflood runs one fake pre-tool call flood (internal/testutil/hookflood)
// as hookflood.Start's child: the conformance suite builds it without -race, so
// that a race build of the suite can still flood at the rate it asks for.
package main

import (
	"fmt"
	"os"

	"github.com/egressd/egressd/internal/testutil/hookflood"
)

func main() {
	hookflood.MainIfChild()
	fmt.Fprintln(os.Stderr, "hookflood: run by hookflood.Start only")
	os.Exit(2)
}
