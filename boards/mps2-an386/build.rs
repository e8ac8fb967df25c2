include!("../fw-support/build_model.rs");

fn main() {
    copy_memory_x();
    copy_model_files();
}
