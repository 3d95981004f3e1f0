// Command vault is HashiCorp Vault's own CLI (v1.20.4), built from its Go
// packages so that docs/vault.md's commands run in tests as an operator types them.
package main

import (
	"os"

	"github.com/hashicorp/vault/command"
)

func main() {
	os.Exit(command.Run(os.Args[1:]))
}
