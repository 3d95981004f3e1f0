package vaultdev_test

import (
	"context"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/egressd/egressd/internal/testutil/vaultdev"
)

// TestStart: the built server starts on 127.0.0.1, answers its health endpoint, and
// Stop ends it.
func TestStart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	bin, err := vaultdev.Build(ctx, "../../../scripts/vaultdev.sh")
	if err != nil {
		if os.Getenv("EGRESSD_REQUIRE_VAULT") == "1" {
			t.Fatal(err)
		}
		t.Skipf("no Vault dev server binary (EGRESSD_REQUIRE_VAULT=1 makes this a failure): %v", err)
	}
	s, err := vaultdev.Start(ctx, bin, t.TempDir(), "error")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	if s.RootToken == "" {
		t.Error("no root token")
	}
	c := &http.Client{Transport: &http.Transport{Proxy: nil}, Timeout: 10 * time.Second}
	resp, err := c.Get(s.Addr + "/v1/sys/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("/v1/sys/health: %d", resp.StatusCode)
	}
	s.Stop()
	c.CloseIdleConnections()
	if _, err := c.Get(s.Addr + "/v1/sys/health"); err == nil {
		t.Error("vault still answers after Stop")
	}
}
