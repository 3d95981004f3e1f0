#!/bin/sh
# vault-init: configures the Vault dev server of docker-compose.yaml for egressd, then
# exits. Idempotent: a second run rewrites the same objects. Runs in the hashicorp/vault
# image with VAULT_ADDR and VAULT_TOKEN (the dev root token) set.
set -eu

until vault status >/dev/null 2>&1; do sleep 1; done

# The KV secret of credential "example-api" (the dev server mounts KV v2 at secret/).
vault kv put secret/egressd/credentials/example-api token="${EXAMPLE_API_TOKEN:-demo-token-change-me}"

# A Vault identity token for credential "agent-identity" (credentials.vault.paths).
vault write identity/oidc/key/egressd allowed_client_ids="*" rotation_period=24h verification_ttl=24h
vault write identity/oidc/role/agent key=egressd ttl=15m

# What egressd may read, and the AppRole it logs in with.
vault policy write egressd - <<'HCL'
path "secret/data/egressd/credentials/*" { capabilities = ["read"] }
path "identity/oidc/token/agent" { capabilities = ["read"] }
HCL
vault auth list -format=json | grep -q '"approle/"' || vault auth enable approle
vault write auth/approle/role/egressd token_policies=egressd token_ttl=1h token_max_ttl=24h

# Role ID and secret ID for egressd, on the volume it mounts read-only.
umask 077
vault read -field=role_id auth/approle/role/egressd/role-id > /run/egressd-vault/role-id
vault write -f -field=secret_id auth/approle/role/egressd/secret-id > /run/egressd-vault/secret-id
# egressd runs as uid 1555 in its image (deploy/docker/Dockerfile): let it read the two files.
chown 1555:1555 /run/egressd-vault/role-id /run/egressd-vault/secret-id
echo "vault-init: done"
