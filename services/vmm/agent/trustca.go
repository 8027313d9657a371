package agent

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"path"
	"path/filepath"

	"github.com/IniZio/nexus/pkg/agentproto"
	"github.com/IniZio/nexus/pkg/atomicfile"
	"github.com/IniZio/nexus/pkg/errdefs"
)

// caBundleMarker precedes the CA appended to the system bundle, so it is appended only once.
const caBundleMarker = "# nexus perimeter CA"

// checkTrustCA validates a configure request's CA: an absolute clean path and exactly one parseable
// certificate, within bounds.
func checkTrustCA(ca *agentproto.TrustCA) error {
	if !path.IsAbs(ca.Path) || path.Clean(ca.Path) != ca.Path || len(ca.Path) > 4096 {
		return errdefs.Invalid("configure: trust_ca: path %.80q is not an absolute clean path", ca.Path)
	}
	if len(ca.PEM) == 0 || len(ca.PEM) > agentproto.MaxTrustCABytes {
		return errdefs.Invalid("configure: trust_ca: certificate of %d bytes (want 1 to %d)", len(ca.PEM), agentproto.MaxTrustCABytes)
	}
	block, rest := pem.Decode(ca.PEM)
	if block == nil || block.Type != "CERTIFICATE" || len(bytes.TrimSpace(rest)) != 0 {
		return errdefs.Invalid("configure: trust_ca: not one PEM certificate")
	}
	if _, err := x509.ParseCertificate(block.Bytes); err != nil {
		return errdefs.Invalid("configure: trust_ca: %v", err)
	}
	return nil
}

// InstallCA writes ca under root (the guest's / in the agent) and appends it to the system bundle
// unless a nexus CA is already there (a restarted guest keeps the one it has). Neither write is
// synced: configure installs the CA on every boot, before anything runs (see SetMachineID).
func InstallCA(root string, ca agentproto.TrustCA) error {
	dst := filepath.Join(root, filepath.FromSlash(ca.Path))
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return fmt.Errorf("configure: trust_ca: %w", err)
	}
	if err := atomicfile.Replace(dst, ca.PEM, 0o644); err != nil {
		return fmt.Errorf("configure: trust_ca: %w", err)
	}
	bundle := filepath.Join(root, filepath.FromSlash(agentproto.SystemCABundle))
	old, err := os.ReadFile(bundle)
	if err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("configure: trust_ca: %w", err)
	}
	if bytes.Contains(old, []byte(caBundleMarker)) {
		return nil
	}
	var b bytes.Buffer
	b.Write(old)
	if len(old) > 0 && !bytes.HasSuffix(old, []byte("\n")) {
		b.WriteByte('\n')
	}
	b.WriteString("\n" + caBundleMarker + "\n")
	b.Write(bytes.TrimSpace(ca.PEM))
	b.WriteByte('\n')
	if err := os.MkdirAll(filepath.Dir(bundle), 0o755); err != nil {
		return fmt.Errorf("configure: trust_ca: %w", err)
	}
	if err := atomicfile.Replace(bundle, b.Bytes(), 0o644); err != nil {
		return fmt.Errorf("configure: trust_ca: %w", err)
	}
	return nil
}
