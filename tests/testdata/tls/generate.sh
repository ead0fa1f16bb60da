#!/usr/bin/env bash
# Regenerates the test certificates of tests/server/server_auth_test.cc (valid for 100 years):
#   ca.pem            the CA that signs the server's and alice's certificates
#   server.pem/.key   the server, for localhost and 127.0.0.1
#   alice.pem/.key    a client certificate with CN=alice (a tenant name)
#   other-ca.pem      another CA, which signs
#   mallory.pem/.key  a client certificate the server's client CA does not verify
# Run it from anywhere: bash tests/testdata/tls/generate.sh
set -euo pipefail
cd "$(dirname "$0")"
days=36500
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

ca() {  # name subject
  openssl req -x509 -newkey rsa:2048 -nodes -days "$days" -subj "$2" \
    -keyout "$work/$1.key" -out "$1.pem" 2>/dev/null
}
leaf() {  # name subject ca extensions
  openssl req -newkey rsa:2048 -nodes -subj "$2" -keyout "$1.key" -out "$work/$1.csr" 2>/dev/null
  printf '%s\n' "$4" >"$work/$1.ext"
  openssl x509 -req -in "$work/$1.csr" -CA "$3.pem" -CAkey "$work/$3.key" -CAcreateserial \
    -CAserial "$work/$3.srl" -days "$days" -extfile "$work/$1.ext" -out "$1.pem" 2>/dev/null
}

ca ca "/CN=gpucompute test CA"
ca other-ca "/CN=gpucompute other CA"
leaf server "/CN=localhost" ca \
  "subjectAltName=DNS:localhost,IP:127.0.0.1
extendedKeyUsage=serverAuth"
leaf alice "/CN=alice" ca "extendedKeyUsage=clientAuth"
leaf mallory "/CN=alice" other-ca "extendedKeyUsage=clientAuth"
chmod 644 ./*.key
