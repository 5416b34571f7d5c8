//! Keeps `docs/config.md` honest: every fenced YAML block that starts with `# sweety-config`
//! must parse and pass `validate_structure()`.

use sweety_config::Config;

/// The fenced ```yaml blocks of `markdown` whose first line starts with `# sweety-config`.
fn config_blocks(markdown: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in markdown.lines() {
        match current.as_mut() {
            None if line.trim_end() == "```yaml" => current = Some(String::new()),
            None => {}
            Some(_) if line.trim_end() == "```" => {
                let block = current.take().unwrap_or_default();
                if block.starts_with("# sweety-config") {
                    blocks.push(block);
                }
            }
            Some(block) => {
                block.push_str(line);
                block.push('\n');
            }
        }
    }
    assert!(current.is_none(), "unterminated ```yaml block");
    blocks
}

#[test]
fn doc_examples_parse_and_validate() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/config.md");
    let markdown = std::fs::read_to_string(path).expect("docs/config.md is readable");
    let blocks = config_blocks(&markdown);
    assert!(
        !blocks.is_empty(),
        "no ```yaml block starting with `# sweety-config`"
    );
    for (i, block) in blocks.iter().enumerate() {
        let config = Config::from_yaml(block)
            .unwrap_or_else(|e| panic!("example {i} does not parse: {e}\n{block}"));
        if let Err(e) = config.validate_structure() {
            panic!("example {i} does not validate: {e}\n{block}");
        }
        assert!(!config.listeners.is_empty(), "example {i} has no listeners");
    }
}

#[test]
fn extracts_only_marked_yaml_blocks() {
    let md = "```yaml\n# sweety-config a\nversion: 1\n```\n\
              ```yaml\ncert: {file: x}\n```\n\
              ```text\n# sweety-config not yaml\n```\n";
    assert_eq!(config_blocks(md), vec!["# sweety-config a\nversion: 1\n"]);
}
