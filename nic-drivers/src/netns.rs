//! netns topology.
