package audit

// ReleaseSpoolForTest drops the publisher's spool file as a dying process would: no flush, the
// lock released.
func (p *Publisher) ReleaseSpoolForTest() { p.spool.f.Close() }
