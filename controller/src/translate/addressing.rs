//! Gateway addressing: each Gateway gets a controller-owned Service whose ports map the
//! Gateway's listener ports onto dataplane container ports allocated here, stable across
//! restarts (existing Services are read back) and never colliding.
