#[path = "e2e/images.rs"]
mod images;
