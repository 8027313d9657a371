package gateway

import "time"

// Event is a lifecycle event on nexus.events.sandbox.<id>.
type Event struct {
	Type    string    `json:"type"` // "state"
	Sandbox string    `json:"sandbox"`
	ID      string    `json:"id"`
	From    State     `json:"from,omitempty"`
	To      State     `json:"to"`
	Reason  string    `json:"reason,omitempty"`
	Time    time.Time `json:"time"`
}

// EventSubject is the subject of a sandbox's lifecycle events.
func EventSubject(id string) string { return "nexus.events.sandbox." + id }
