// Placeholder: implemented in its own change.
namespace kvlab {}
