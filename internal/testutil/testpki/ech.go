package testpki

import (
	"crypto/ecdh"
	"crypto/rand"
	"crypto/tls"
	"encoding/binary"
	"testing"
)

// ECH is an Encrypted Client Hello key for a test edge (RFC 9849): the config list a
// client is given and the key a tls.Config serves it with.
type ECH struct {
	ConfigList []byte                      // tls.Config.EncryptedClientHelloConfigList, for clients
	Key        tls.EncryptedClientHelloKey // tls.Config.EncryptedClientHelloKeys, for the edge
}

// NewECH makes an ECH key whose outer ClientHello names publicName: DHKEM(X25519,
// HKDF-SHA256) with HKDF-SHA256 and AES-128-GCM.
func NewECH(t testing.TB, publicName string) ECH {
	t.Helper()
	key, err := ecdh.X25519().GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	config := echConfig(7, key.PublicKey().Bytes(), publicName)
	return ECH{
		ConfigList: prefixed16(config),
		Key:        tls.EncryptedClientHelloKey{Config: config, PrivateKey: key.Bytes(), SendAsRetry: true},
	}
}

// echConfig encodes one ECHConfig (RFC 9849 §4), without extensions.
func echConfig(id uint8, pub []byte, publicName string) []byte {
	contents := []byte{id, 0x00, 0x20} // config_id, DHKEM(X25519, HKDF-SHA256)
	contents = append(contents, prefixed16(pub)...)
	contents = append(contents, prefixed16([]byte{0, 1, 0, 1})...) // HKDF-SHA256, AES-128-GCM
	contents = append(contents, 0, byte(len(publicName)))          // maximum_name_length, public_name
	contents = append(contents, publicName...)
	contents = append(contents, 0, 0) // extensions
	return append([]byte{0xfe, 0x0d}, prefixed16(contents)...)
}

func prefixed16(b []byte) []byte {
	return append(binary.BigEndian.AppendUint16(nil, uint16(len(b))), b...)
}
