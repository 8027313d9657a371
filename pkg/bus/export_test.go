package bus

// Permissions is the permission table, for the contract tests in bus_test.
var Permissions = permissions
