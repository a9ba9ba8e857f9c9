//! The repository's own files as other tools read them: deploy/, the protos, and
//! the paths of the tools that check them.

mod deploy_files;
mod protos;
pub(crate) mod tools;
