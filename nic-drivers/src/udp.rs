//! Kernel UDP socket backend (todo).
