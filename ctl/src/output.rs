//! Tables for people, JSON for scripts.

use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};

/// The output format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// An aligned table.
    Table,
    /// One JSON document.
    Json,
}

/// Prints `rows` under `header` as a table, or `json` as JSON.
#[allow(clippy::print_stdout)]
pub fn print(output: Output, header: &[&str], rows: Vec<Vec<String>>, json: serde_json::Value) {
    match output {
        Output::Json => println!("{json:#}"),
        Output::Table => {
            let mut table = Table::new();
            table
                .load_preset(UTF8_FULL_CONDENSED)
                .set_header(header.to_vec());
            for row in rows {
                table.add_row(row);
            }
            println!("{table}");
        }
    }
}
