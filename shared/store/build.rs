// `sqlx::migrate!` embeds `migrations/` at compile time but does not tell cargo to watch it:
// without this, adding a migration would not rebuild the crate that carries the schema.
fn main() {
    println!("cargo:rerun-if-changed=../../migrations");
}
