//go:build race

package bus_test

// raceDetector says the tests were built with -race.
const raceDetector = true
